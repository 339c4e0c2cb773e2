import java.io.Reader;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

import com.ibm.icu.text.FilteredNormalizer2;
import com.ibm.icu.text.Normalizer2;
import com.ibm.icu.text.UnicodeSet;

import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.Tokenizer;
import org.apache.lucene.analysis.cn.smart.HMMChineseTokenizer;
import org.apache.lucene.analysis.icu.ICUFoldingFilter;
import org.apache.lucene.analysis.icu.ICUNormalizer2CharFilter;
import org.apache.lucene.analysis.icu.ICUNormalizer2Filter;
import org.apache.lucene.analysis.icu.segmentation.DefaultICUTokenizerConfig;
import org.apache.lucene.analysis.icu.segmentation.ICUTokenizer;
import org.apache.lucene.analysis.ja.JapaneseBaseFormFilter;
import org.apache.lucene.analysis.ja.JapaneseKatakanaStemFilter;
import org.apache.lucene.analysis.ja.JapaneseTokenizer;
import org.apache.lucene.analysis.ko.KoreanPartOfSpeechStopFilter;
import org.apache.lucene.analysis.ko.KoreanTokenizer;
import org.apache.lucene.analysis.ko.POS;
import org.opensearch.common.settings.Settings;
import org.opensearch.index.IndexSettings;
import org.opensearch.index.analysis.AbstractCharFilterFactory;
import org.opensearch.index.analysis.AbstractTokenFilterFactory;
import org.opensearch.index.analysis.AbstractTokenizerFactory;
import org.opensearch.index.analysis.CharFilterFactory;
import org.opensearch.index.analysis.NormalizingCharFilterFactory;
import org.opensearch.index.analysis.NormalizingTokenFilterFactory;
import org.opensearch.index.analysis.TokenFilterFactory;
import org.opensearch.index.analysis.TokenizerFactory;
import org.opensearch.indices.analysis.AnalysisModule.AnalysisProvider;
import org.opensearch.plugins.AnalysisPlugin;
import org.opensearch.plugins.Plugin;

/**
 * The dev node's stand-in for the official analysis-icu, analysis-kuromoji, analysis-smartcn and
 * analysis-nori plugins, which are not published to Maven Central: the Lucene classes those plugins
 * wrap, registered under the plugins' documented names and parameters, so the index templates run
 * unchanged here and on an official image with the official plugins installed.
 *
 * Only the subset the templates can use is offered, with the official defaults and the official
 * meaning of {@code unicode_set_filter} (the normalizer/folding applies only to characters in the
 * set). A parameter the official plugin has but this stand-in does not implement (dictionaries,
 * rule files) is refused at index creation rather than silently ignored: a template that passes
 * here then means the same on a production cluster.
 */
public final class TenureAnalysisPlugin extends Plugin implements AnalysisPlugin {

    @Override
    public Map<String, AnalysisProvider<CharFilterFactory>> getCharFilters() {
        Map<String, AnalysisProvider<CharFilterFactory>> out = new HashMap<>();
        out.put("icu_normalizer", IcuNormalizerCharFilter::new);
        return out;
    }

    @Override
    public Map<String, AnalysisProvider<TokenFilterFactory>> getTokenFilters() {
        Map<String, AnalysisProvider<TokenFilterFactory>> out = new HashMap<>();
        out.put("icu_normalizer", IcuNormalizerFilter::new);
        out.put("icu_folding", IcuFoldingFilter::new);
        out.put("kuromoji_stemmer", KuromojiStemmer::new);
        out.put("kuromoji_baseform", KuromojiBaseForm::new);
        out.put("nori_part_of_speech", NoriPartOfSpeech::new);
        return out;
    }

    @Override
    public Map<String, AnalysisProvider<TokenizerFactory>> getTokenizers() {
        Map<String, AnalysisProvider<TokenizerFactory>> out = new HashMap<>();
        out.put("icu_tokenizer", IcuTokenizer::new);
        out.put("kuromoji_tokenizer", KuromojiTokenizer::new);
        out.put("smartcn_tokenizer", SmartcnTokenizer::new);
        out.put("nori_tokenizer", NoriTokenizer::new);
        return out;
    }

    /** Settings keys every factory accepts besides its own: the type, and (for a factory used by
     *  name without settings of its own) the index settings OpenSearch passes in their place. */
    private static final Set<String> COMMON = Set.of("type", "version");

    private static void onlyKnown(Settings settings, String name, Set<String> known) {
        for (String key : settings.keySet()) {
            if (!COMMON.contains(key) && !key.startsWith("index.") && !known.contains(key)) {
                throw new IllegalArgumentException(
                    "[" + name + "] parameter [" + key + "] is not supported by the dev node's analysis plugin");
            }
        }
    }

    private static Normalizer2 normalizer(Settings settings, String name) {
        onlyKnown(settings, name, Set.of("name", "mode", "unicode_set_filter"));
        String form = settings.get("name", "nfkc_cf");
        String mode = settings.get("mode", "compose");
        if (!mode.equals("compose") && !mode.equals("decompose")) {
            throw new IllegalArgumentException("[" + name + "] mode must be compose or decompose, got [" + mode + "]");
        }
        return filtered(Normalizer2.getInstance(
            null, form, mode.equals("compose") ? Normalizer2.Mode.COMPOSE : Normalizer2.Mode.DECOMPOSE), settings);
    }

    /** The official plugins' {@code unicode_set_filter}: normalise only characters in the set. */
    private static Normalizer2 filtered(Normalizer2 normalizer, Settings settings) {
        String filter = settings.get("unicode_set_filter");
        if (filter == null) {
            return normalizer;
        }
        UnicodeSet set = new UnicodeSet(filter);
        set.freeze();
        return new FilteredNormalizer2(normalizer, set);
    }

    static final class IcuNormalizerCharFilter extends AbstractCharFilterFactory implements NormalizingCharFilterFactory {
        private final Normalizer2 normalizer;

        IcuNormalizerCharFilter(IndexSettings index, org.opensearch.env.Environment env, String name, Settings settings) {
            super(index, name);
            this.normalizer = normalizer(settings, name);
        }

        @Override
        public Reader create(Reader reader) {
            return new ICUNormalizer2CharFilter(reader, normalizer);
        }
    }

    static final class IcuNormalizerFilter extends AbstractTokenFilterFactory implements NormalizingTokenFilterFactory {
        private final Normalizer2 normalizer;

        IcuNormalizerFilter(IndexSettings index, org.opensearch.env.Environment env, String name, Settings settings) {
            super(index, name, settings);
            this.normalizer = normalizer(settings, name);
        }

        @Override
        public TokenStream create(TokenStream stream) {
            return new ICUNormalizer2Filter(stream, normalizer);
        }
    }

    static final class IcuFoldingFilter extends AbstractTokenFilterFactory implements NormalizingTokenFilterFactory {
        private final Normalizer2 folding;

        IcuFoldingFilter(IndexSettings index, org.opensearch.env.Environment env, String name, Settings settings) {
            super(index, name, settings);
            onlyKnown(settings, name, Set.of("unicode_set_filter"));
            this.folding = filtered(ICUFoldingFilter.NORMALIZER, settings);
        }

        @Override
        public TokenStream create(TokenStream stream) {
            return new ICUFoldingFilter(stream, folding);
        }
    }

    static final class KuromojiStemmer extends AbstractTokenFilterFactory {
        private final int minimumLength;

        KuromojiStemmer(IndexSettings index, org.opensearch.env.Environment env, String name, Settings settings) {
            super(index, name, settings);
            onlyKnown(settings, name, Set.of("minimum_length"));
            this.minimumLength = settings.getAsInt("minimum_length", JapaneseKatakanaStemFilter.DEFAULT_MINIMUM_LENGTH);
        }

        @Override
        public TokenStream create(TokenStream stream) {
            return new JapaneseKatakanaStemFilter(stream, minimumLength);
        }
    }

    static final class KuromojiBaseForm extends AbstractTokenFilterFactory {
        KuromojiBaseForm(IndexSettings index, org.opensearch.env.Environment env, String name, Settings settings) {
            super(index, name, settings);
            onlyKnown(settings, name, Set.of());
        }

        @Override
        public TokenStream create(TokenStream stream) {
            return new JapaneseBaseFormFilter(stream);
        }
    }

    /** The official {@code nori_part_of_speech}: drops tokens whose part-of-speech tag is in
     *  {@code stoptags} (default: Lucene's list: particles, endings, affixes, punctuation...). */
    static final class NoriPartOfSpeech extends AbstractTokenFilterFactory {
        private final Set<POS.Tag> stopTags;

        NoriPartOfSpeech(IndexSettings index, org.opensearch.env.Environment env, String name, Settings settings) {
            super(index, name, settings);
            onlyKnown(settings, name, Set.of("stoptags"));
            List<String> tags = settings.getAsList("stoptags", null);
            if (tags == null) {
                this.stopTags = KoreanPartOfSpeechStopFilter.DEFAULT_STOP_TAGS;
            } else {
                Set<POS.Tag> chosen = new HashSet<>();
                for (String tag : tags) {
                    chosen.add(POS.resolveTag(tag));
                }
                this.stopTags = chosen;
            }
        }

        @Override
        public TokenStream create(TokenStream stream) {
            return new KoreanPartOfSpeechStopFilter(stream, stopTags);
        }
    }

    static final class IcuTokenizer extends AbstractTokenizerFactory {
        IcuTokenizer(IndexSettings index, org.opensearch.env.Environment env, String name, Settings settings) {
            super(index, settings, name);
            onlyKnown(settings, name, Set.of());
        }

        @Override
        public Tokenizer create() {
            // the official plugin's default: dictionary-based words for Chinese/Japanese and Myanmar
            return new ICUTokenizer(new DefaultICUTokenizerConfig(true, true));
        }
    }

    static final class KuromojiTokenizer extends AbstractTokenizerFactory {
        private final JapaneseTokenizer.Mode mode;
        private final boolean discardPunctuation;
        private final boolean discardCompoundToken;

        KuromojiTokenizer(IndexSettings index, org.opensearch.env.Environment env, String name, Settings settings) {
            super(index, settings, name);
            onlyKnown(settings, name, Set.of("mode", "discard_punctuation", "discard_compound_token"));
            this.mode = JapaneseTokenizer.Mode.valueOf(settings.get("mode", "search").toUpperCase(Locale.ROOT));
            this.discardPunctuation = settings.getAsBoolean("discard_punctuation", true);
            this.discardCompoundToken = settings.getAsBoolean("discard_compound_token", false);
        }

        @Override
        public Tokenizer create() {
            return new JapaneseTokenizer(null, discardPunctuation, discardCompoundToken, mode);
        }
    }

    static final class SmartcnTokenizer extends AbstractTokenizerFactory {
        SmartcnTokenizer(IndexSettings index, org.opensearch.env.Environment env, String name, Settings settings) {
            super(index, settings, name);
            onlyKnown(settings, name, Set.of());
        }

        @Override
        public Tokenizer create() {
            return new HMMChineseTokenizer();
        }
    }

    static final class NoriTokenizer extends AbstractTokenizerFactory {
        private final KoreanTokenizer.DecompoundMode decompoundMode;
        private final boolean discardPunctuation;

        NoriTokenizer(IndexSettings index, org.opensearch.env.Environment env, String name, Settings settings) {
            super(index, settings, name);
            onlyKnown(settings, name, Set.of("decompound_mode", "discard_punctuation"));
            this.decompoundMode =
                KoreanTokenizer.DecompoundMode.valueOf(settings.get("decompound_mode", "discard").toUpperCase(Locale.ROOT));
            this.discardPunctuation = settings.getAsBoolean("discard_punctuation", true);
        }

        @Override
        public Tokenizer create() {
            return new KoreanTokenizer(
                org.apache.lucene.analysis.TokenStream.DEFAULT_TOKEN_ATTRIBUTE_FACTORY, null, decompoundMode, false, discardPunctuation);
        }
    }
}
