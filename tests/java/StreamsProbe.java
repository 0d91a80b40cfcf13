// A Kafka Streams application (kafka-streams 4.4.0), run by the Python tests through the
// Sluice proxy and directly against Kafka, to compare what each writes.
//
// Topology: records of the input topic ("<category> <text>") are re-keyed by their category
// (a repartition topic) and aggregated per category into "n=<count>;<text>|<text>..." (a state
// store with its changelog topic), and every update goes to the output topic. Exactly-once v2.
// The run ends once --records records have reached the aggregation: close() flushes the
// store's cache and commits the last transaction. Prints one JSON object: {"processed": N, "topics": [internal topics]}.
//
//   StreamsProbe --bootstrap HOST:PORT --application-id ID --input T --output T --records N

import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

public final class StreamsProbe {
    private StreamsProbe() {}

    public static void main(String[] argv) throws Exception {
        Map<String, String> opts = new HashMap<>();
        for (int i = 0; i + 1 < argv.length; i += 2) {
            opts.put(argv[i].replaceFirst("^--", ""), argv[i + 1]);
        }
        String bootstrap = need(opts, "bootstrap");
        String appId = need(opts, "application-id");
        int records = Integer.parseInt(need(opts, "records"));
        long timeoutMs = Long.parseLong(opts.getOrDefault("timeout-ms", "90000"));

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.STATE_DIR_CONFIG, need(opts, "state-dir"));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, "1");
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "200");
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        // In-memory stores (their changelog topics are the same): RocksDB's 73 MB native jar
        // is left out of the install (scripts/kafka/pom.xml).
        props.put(StreamsConfig.DSL_STORE_SUPPLIERS_CLASS_CONFIG,
                org.apache.kafka.streams.state.BuiltInDslStoreSuppliers.InMemoryDslStoreSuppliers.class);

        AtomicInteger processed = new AtomicInteger();
        CountDownLatch done = new CountDownLatch(1);
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(need(opts, "input"), Consumed.with(Serdes.String(), Serdes.String()))
                .groupBy((k, v) -> v.split(" ", 2)[0], Grouped.with("by-category", Serdes.String(), Serdes.String()))
                .aggregate(
                        () -> "n=0;",
                        (category, value, agg) -> {
                            int semi = agg.indexOf(';');
                            int n = Integer.parseInt(agg.substring(2, semi)) + 1;
                            String rest = agg.substring(semi + 1);
                            String text = value.split(" ", 2).length > 1 ? value.split(" ", 2)[1] : "";
                            // Counted after the repartition topic: a record got this far.
                            if (processed.incrementAndGet() >= records) {
                                done.countDown();
                            }
                            return "n=" + n + ";" + (rest.isEmpty() ? text : rest + "|" + text);
                        },
                        Materialized.<String, String>as(
                                org.apache.kafka.streams.state.Stores.inMemoryKeyValueStore("per-category"))
                                .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()))
                .toStream()
                .to(need(opts, "output"), Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        StringBuilder failure = new StringBuilder();
        streams.setUncaughtExceptionHandler(e -> {
            failure.append(e.getClass().getSimpleName()).append(": ").append(e.getMessage());
            done.countDown();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
                    .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        boolean finished = done.await(timeoutMs, TimeUnit.MILLISECONDS);
        // close() commits the open transaction: everything processed is then in the output.
        streams.close(Duration.ofSeconds(60));

        TreeSet<String> internal = new TreeSet<>();
        Properties adminProps = new Properties();
        adminProps.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(adminProps)) {
            for (String name : admin.listTopics().names().get(30, TimeUnit.SECONDS)) {
                if (name.startsWith(appId + "-")) {
                    internal.add(name);
                }
            }
        }
        StringBuilder out = new StringBuilder();
        out.append("{\"processed\":").append(processed.get())
                .append(",\"finished\":").append(finished)
                .append(",\"failure\":\"").append(failure.toString().replace("\\", "\\\\").replace("\"", "'"))
                .append("\",\"topics\":[");
        boolean first = true;
        for (String name : internal) {
            out.append(first ? "" : ",").append('"').append(name).append('"');
            first = false;
        }
        out.append("]}");
        System.out.println(out);
        System.out.flush();
        System.exit(0);
    }

    static String need(Map<String, String> opts, String name) {
        String value = opts.get(name);
        if (value == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return value;
    }
}
