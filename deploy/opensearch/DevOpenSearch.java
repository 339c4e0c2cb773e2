import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.opensearch.common.logging.LogConfigurator;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.plugins.Plugin;

/**
 * Starts one OpenSearch node inside this JVM with the modules loaded as classpath plugins.
 * Usage: java -cp 'classes:lib/*' DevOpenSearch HOME [key=value ...]
 * HOME/config must hold opensearch.yml and log4j2.properties.
 * Going through Node rather than Bootstrap avoids the root refusal and the security manager,
 * which is what lets CI (root) run a real node without Docker.
 */
public final class DevOpenSearch {

    /** Node's plugin-taking constructor is protected in 2.x. */
    static final class ClasspathPluginNode extends Node {
        ClasspathPluginNode(Environment env, Collection<Class<? extends Plugin>> plugins) {
            super(env, plugins, true);
        }
    }

    private static final String[] REQUIRED = {
        "org.opensearch.transport.Netty4Plugin",
        "org.opensearch.analysis.common.CommonAnalysisPlugin",
        "org.opensearch.painless.PainlessPlugin",
        "org.opensearch.index.reindex.ReindexPlugin",
        "org.opensearch.index.mapper.MapperExtrasPlugin",
        // icu_*, kuromoji_*, smartcn_tokenizer, nori_tokenizer under the official plugins' names
        "TenureAnalysisPlugin",
    };

    public static void main(String[] args) throws Exception {
        Path home = Paths.get(args.length > 0 ? args[0] : "opensearch-home").toAbsolutePath();
        for (String d : new String[] { "config", "data", "logs", "plugins", "modules" }) {
            Files.createDirectories(home.resolve(d));
        }
        Settings.Builder input = Settings.builder().put("path.home", home.toString());
        for (int i = 1; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            input.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        Environment env = InternalSettingsPreparer.prepareEnvironment(
            input.build(), Collections.emptyMap(), home.resolve("config"), () -> "node-1");

        LogConfigurator.registerErrorListener();
        LogConfigurator.configure(env);

        List<Class<? extends Plugin>> plugins = new ArrayList<>();
        for (String c : REQUIRED) {
            plugins.add(Class.forName(c).asSubclass(Plugin.class));
        }

        Node node = new ClasspathPluginNode(env, plugins);
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
                node.awaitClose(20, TimeUnit.SECONDS);
            } catch (Exception e) {
                e.printStackTrace();
            } finally {
                stopped.countDown();
            }
        }, "opensearch-shutdown"));
        node.start();
        stopped.await();   // OpenSearch's threads are daemons: keep main alive
    }
}
