import java.nio.file.Path;
import java.util.List;
import org.apache.lucene.analysis.Analyzer;
import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.tokenattributes.CharTermAttribute;
import org.apache.lucene.analysis.tokenattributes.PositionIncrementAttribute;
import org.opensearch.Version;
import org.opensearch.analysis.common.CommonAnalysisPlugin;
import org.opensearch.cluster.metadata.IndexMetadata;
import org.opensearch.common.settings.Settings;
import org.opensearch.core.xcontent.MediaTypeRegistry;
import org.opensearch.env.Environment;
import org.opensearch.index.IndexSettings;
import org.opensearch.index.analysis.AnalysisRegistry;
import org.opensearch.index.analysis.IndexAnalyzers;
import org.opensearch.indices.analysis.AnalysisModule;

/**
 * One index's analyzers, built by OpenSearch's own analysis module from the index's settings
 * (the same classes and plugins as the node: analysis-common and the dev node's CJK plugin), so
 * the API can analyse a recall query without a round trip. service/storage/local_analysis.py
 * drives it through JPype and checks it against the node's own analysis before using it.
 */
public final class QueryAnalysis {
    private final AnalysisRegistry registry;
    private final IndexAnalyzers analyzers;

    /** {@code indexSettings}: the index's settings as {@code GET <index>/_settings} returns them. */
    public QueryAnalysis(String indexSettings, String home) throws Exception {
        Settings node = Settings.builder().put("path.home", home).build();
        AnalysisModule module = new AnalysisModule(
            new Environment(node, Path.of(home, "config")),
            List.of(new CommonAnalysisPlugin(), new TenureAnalysisPlugin()));
        registry = module.getAnalysisRegistry();
        Settings index = Settings.builder().loadFromSource(indexSettings, MediaTypeRegistry.JSON).build();
        IndexMetadata metadata = IndexMetadata.builder("query-analysis").settings(index).build();
        analyzers = registry.build(new IndexSettings(metadata, node));
    }

    /** The OpenSearch and Lucene versions of these classes (the node's must be the same). */
    public static String versions() {
        return Version.CURRENT + " " + org.apache.lucene.util.Version.LATEST;
    }

    /**
     * {@code text}'s tokens under {@code analyzer} (an index analyzer or a built-in one), as the
     * node indexes a field, grouped by position: a token stream's positions never decrease (each
     * increment is at least 0), so the tokens of one position come one after the other, and a
     * group ends where the position advances. One string, "term (\u001f term)* \u001e" per
     * position in order (gaps left out), so a query is one call from Python and its answer is
     * split in C there, not parsed token by token.
     */
    public String groups(String analyzer, String field, String text) throws Exception {
        Analyzer chosen = analyzers.get(analyzer);
        if (chosen == null) {
            chosen = registry.getAnalyzer(analyzer);
        }
        if (chosen == null) {
            throw new IllegalArgumentException("no analyzer named " + analyzer);
        }
        StringBuilder out = new StringBuilder(text.length() * 2);
        try (TokenStream tokens = chosen.tokenStream(field, text)) {
            CharTermAttribute term = tokens.addAttribute(CharTermAttribute.class);
            PositionIncrementAttribute increment = tokens.addAttribute(PositionIncrementAttribute.class);
            tokens.reset();
            boolean open = false;
            while (tokens.incrementToken()) {
                if (!open) {
                    open = true;
                } else if (increment.getPositionIncrement() > 0) {
                    out.append('\u001e');
                } else {
                    out.append('\u001f');
                }
                out.append(term);
            }
            tokens.end();
            if (open) {
                out.append('\u001e');
            }
        }
        return out.toString();
    }
}
