/*
 * Starts Kroxylicious's runtime from a YAML config file, for the benchmark (bench/kroxylicious.py).
 *
 * Kroxylicious's own launcher (the kroxylicious-app module) is not published to Maven Central,
 * only the runtime and the filters are; this is the least that starts the runtime: parse the
 * config with the runtime's ConfigParser (which is also its plugin registry), start the proxy
 * with the default feature set, print one line once every port is bound, and block until the
 * process is terminated.
 *
 * Run as a single source file (java 11+ compiles it in memory):
 *   java -cp 'LIBS/*' KroxyliciousLauncher.java CONFIG.yaml
 */

import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;

import io.kroxylicious.proxy.KafkaProxy;
import io.kroxylicious.proxy.config.ConfigParser;
import io.kroxylicious.proxy.config.Configuration;
import io.kroxylicious.proxy.internal.config.Features;

public final class KroxyliciousLauncher {

    /** The line bench/kroxylicious.py waits for. */
    static final String READY = "kroxylicious-launcher: started";

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: KroxyliciousLauncher CONFIG.yaml");
            System.exit(2);
        }
        ConfigParser parser = new ConfigParser();
        Configuration config;
        try (InputStream in = Files.newInputStream(Path.of(args[0]))) {
            config = parser.parseConfiguration(in);
        }
        try (KafkaProxy proxy = new KafkaProxy(parser, config, Features.defaultFeatures())) {
            proxy.startup();
            System.out.println(READY);
            System.out.flush();
            proxy.block();
        }
    }
}
