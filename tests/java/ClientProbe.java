// The Java Kafka client (kafka-clients), driven by the Python tests through the Sluice proxy.
//
// One mode per run, options as `--name value` (flags without a value), record values one per
// line on stdin, and one JSON object on stdout. The tests compile this file with
// `javac -cp '<kafka libs>/*'` (tests/harness/kafka_tools.py); nothing here talks to anything
// but the bootstrap address it is given.
//
//   produce      [--idempotent] [--acks all] [--compression lz4]  values from stdin -> {"offsets": [...]}
//   transactional --transactional-id ID                 stdin lines "commit:V" / "abort:V", one
//                                                      transaction per run of equal outcomes
//   consume      --group G --protocol classic|consumer --count N [--isolation read_committed]
//                [--no-values]
//   share        --group G --count N                    KafkaShareConsumer (KIP-932)
//   admin        --topic T --partitions P               create, describe, describe configs,
//                                                      incrementalAlterConfigs, describe again

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class ClientProbe {
    private ClientProbe() {}

    public static void main(String[] argv) throws Exception {
        if (argv.length < 1) {
            System.err.println("usage: ClientProbe MODE --bootstrap HOST:PORT [--name value ...]");
            System.exit(2);
        }
        String mode = argv[0];
        Map<String, String> opts = parse(argv);
        Map<String, Object> out;
        switch (mode) {
            case "produce": out = produce(opts, readLines()); break;
            case "transactional": out = transactional(opts, readLines()); break;
            case "consume": out = consume(opts); break;
            case "share": out = share(opts); break;
            case "admin": out = admin(opts); break;
            default:
                System.err.println("unknown mode " + mode);
                System.exit(2);
                return;
        }
        System.out.println(json(out));
        System.out.flush();
        // Client threads (metrics, network) must not keep the JVM alive after the answer.
        System.exit(0);
    }

    static Map<String, String> parse(String[] argv) {
        Map<String, String> opts = new HashMap<>();
        for (int i = 1; i < argv.length; i++) {
            if (!argv[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --name, got " + argv[i]);
            }
            String name = argv[i].substring(2);
            if (i + 1 < argv.length && !argv[i + 1].startsWith("--")) {
                opts.put(name, argv[++i]);
            } else {
                opts.put(name, "true");
            }
        }
        return opts;
    }

    static String need(Map<String, String> opts, String name) {
        String value = opts.get(name);
        if (value == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return value;
    }

    static List<String> readLines() throws Exception {
        List<String> lines = new ArrayList<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            lines.add(line);
        }
        return lines;
    }

    static Properties base(Map<String, String> opts) {
        Properties props = new Properties();
        props.put("bootstrap.servers", need(opts, "bootstrap"));
        props.put("client.id", "sluice-java-probe");
        return props;
    }

    static KafkaProducer<String, String> producer(Properties props) {
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        props.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        return new KafkaProducer<>(props);
    }

    static Map<String, Object> produce(Map<String, String> opts, List<String> values) throws Exception {
        Properties props = base(opts);
        boolean idempotent = opts.containsKey("idempotent");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, Boolean.toString(idempotent));
        props.put(ProducerConfig.ACKS_CONFIG, opts.getOrDefault("acks", "all"));
        props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, opts.getOrDefault("compression", "none"));
        String topic = need(opts, "topic");
        List<Long> offsets = new ArrayList<>();
        try (KafkaProducer<String, String> producer = producer(props)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < values.size(); i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, 0, "k" + i, values.get(i))));
            }
            for (Future<RecordMetadata> f : sent) {
                offsets.add(f.get(60, TimeUnit.SECONDS).offset());
            }
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("offsets", offsets);
        out.put("idempotent", idempotent);
        return out;
    }

    static Map<String, Object> transactional(Map<String, String> opts, List<String> lines) throws Exception {
        Properties props = base(opts);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, need(opts, "transactional-id"));
        props.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "30000");
        String topic = need(opts, "topic");
        List<String> outcomes = new ArrayList<>();
        try (KafkaProducer<String, String> producer = producer(props)) {
            producer.initTransactions();
            String open = null;
            int i = 0;
            for (String line : lines) {
                int colon = line.indexOf(':');
                String outcome = line.substring(0, colon);
                String value = line.substring(colon + 1);
                if (!outcome.equals("commit") && !outcome.equals("abort")) {
                    throw new IllegalArgumentException("line must start commit: or abort:, got " + line);
                }
                if (open != null && !open.equals(outcome)) {
                    finish(producer, open, outcomes);
                    open = null;
                }
                if (open == null) {
                    producer.beginTransaction();
                    open = outcome;
                }
                producer.send(new ProducerRecord<>(topic, 0, "t" + (i++), value));
            }
            if (open != null) {
                finish(producer, open, outcomes);
            }
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("transactions", outcomes);
        return out;
    }

    static void finish(KafkaProducer<String, String> producer, String outcome, List<String> outcomes) {
        producer.flush();
        if (outcome.equals("commit")) {
            producer.commitTransaction();
        } else {
            producer.abortTransaction();
        }
        outcomes.add(outcome);
    }

    static Map<String, Object> consume(Map<String, String> opts) {
        Properties props = base(opts);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, need(opts, "group"));
        props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, opts.getOrDefault("protocol", "classic"));
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, opts.getOrDefault("isolation", "read_uncommitted"));
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        int count = Integer.parseInt(need(opts, "count"));
        long deadline = System.currentTimeMillis() + Long.parseLong(opts.getOrDefault("timeout-ms", "30000"));
        List<String> values = new ArrayList<>();
        List<Long> offsets = new ArrayList<>();
        Map<String, Object> out = new LinkedHashMap<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(need(opts, "topic")));
            while (values.size() < count && System.currentTimeMillis() < deadline) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(500));
                for (ConsumerRecord<String, String> r : records) {
                    values.add(r.value());
                    offsets.add(r.offset());
                }
            }
            consumer.commitSync(Duration.ofSeconds(15));
            out.put("generation", consumer.groupMetadata().generationId());
            // What the broker says the group is (CLASSIC or CONSUMER), asked while it has
            // this member, through the same bootstrap address.
            try (Admin admin = Admin.create(base(opts))) {
                String group = need(opts, "group");
                ConsumerGroupDescription desc = admin.describeConsumerGroups(List.of(group))
                        .all().get(30, TimeUnit.SECONDS).get(group);
                out.put("group_type", desc.type().toString());
                out.put("members", desc.members().size());
            } catch (Exception e) {
                out.put("group_type", "error: " + e);
            }
        }
        // --no-values: ciphertext read as strings may hold line separators the caller's
        // line split would cut the answer at; the offsets say what was read.
        if (!opts.containsKey("no-values")) {
            out.put("values", values);
        }
        out.put("offsets", offsets);
        return out;
    }

    static Map<String, Object> share(Map<String, String> opts) {
        Properties props = base(opts);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, need(opts, "group"));
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        int count = Integer.parseInt(need(opts, "count"));
        long deadline = System.currentTimeMillis() + Long.parseLong(opts.getOrDefault("timeout-ms", "30000"));
        List<String> values = new ArrayList<>();
        List<String> errors = new ArrayList<>();
        // A share group starts at the log end unless its group config says otherwise.
        Properties adminProps = base(opts);
        adminProps.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(adminProps)) {
            ConfigResource group = new ConfigResource(ConfigResource.Type.GROUP, need(opts, "group"));
            admin.incrementalAlterConfigs(Map.of(group, List.of(new AlterConfigOp(
                    new ConfigEntry("share.auto.offset.reset", "earliest"), AlterConfigOp.OpType.SET))))
                    .all().get(30, TimeUnit.SECONDS);
        } catch (Exception e) {
            errors.add("group config: " + e.getClass().getSimpleName() + ": " + e.getMessage());
        }
        try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(props)) {
            consumer.subscribe(List.of(need(opts, "topic")));
            while (values.size() < count && System.currentTimeMillis() < deadline) {
                try {
                    ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(500));
                    for (ConsumerRecord<String, String> r : records) {
                        values.add(r.value());
                    }
                    if (!records.isEmpty()) {
                        consumer.commitSync(Duration.ofSeconds(15));
                    }
                } catch (RuntimeException e) {
                    // Kept going until the deadline: a refusal must stay a refusal on retry.
                    String text = e.getClass().getSimpleName() + ": " + e.getMessage();
                    if (!errors.contains(text)) {
                        errors.add(text);
                    }
                    sleep(200);
                }
            }
        } catch (RuntimeException e) {
            errors.add("close: " + e.getClass().getSimpleName() + ": " + e.getMessage());
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("values", values);
        out.put("errors", errors);
        return out;
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    static Map<String, Object> admin(Map<String, String> opts) throws Exception {
        Properties props = base(opts);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        String topic = need(opts, "topic");
        int partitions = Integer.parseInt(opts.getOrDefault("partitions", "1"));
        Map<String, Object> out = new LinkedHashMap<>();
        try (Admin admin = Admin.create(props)) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get(30, TimeUnit.SECONDS);
            TopicDescription desc = admin.describeTopics(List.of(topic)).allTopicNames()
                    .get(30, TimeUnit.SECONDS).get(topic);
            out.put("partitions", desc.partitions().size());
            out.put("topic_id", desc.topicId().toString());
            out.put("listed", admin.listTopics().names().get(30, TimeUnit.SECONDS).contains(topic));
            ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
            out.put("retention_before", configValue(admin, resource, "retention.ms"));
            Map<ConfigResource, Collection<AlterConfigOp>> alter = Map.of(resource, List.of(
                    new AlterConfigOp(new ConfigEntry("retention.ms", "4321000"), AlterConfigOp.OpType.SET),
                    new AlterConfigOp(new ConfigEntry("cleanup.policy", "compact"), AlterConfigOp.OpType.SET)));
            admin.incrementalAlterConfigs(alter).all().get(30, TimeUnit.SECONDS);
            // The broker applies a config change through its metadata log: read until it shows.
            String after = null;
            String policy = null;
            long deadline = System.currentTimeMillis() + 10000;
            while (System.currentTimeMillis() < deadline) {
                after = configValue(admin, resource, "retention.ms");
                policy = configValue(admin, resource, "cleanup.policy");
                if ("4321000".equals(after) && "compact".equals(policy)) {
                    break;
                }
                sleep(100);
            }
            out.put("retention_after", after);
            out.put("cleanup_policy_after", policy);
            out.put("cluster_nodes", admin.describeCluster().nodes().get(30, TimeUnit.SECONDS).size());
        }
        return out;
    }

    static String configValue(Admin admin, ConfigResource resource, String name) throws Exception {
        Config config = admin.describeConfigs(Set.of(resource)).all().get(30, TimeUnit.SECONDS).get(resource);
        ConfigEntry entry = config.get(name);
        return entry == null ? null : entry.value();
    }

    // ---- a minimal JSON writer (strings, numbers, booleans, lists, maps, null) ----------------

    static String json(Object value) {
        StringBuilder sb = new StringBuilder();
        write(sb, value);
        return sb.toString();
    }

    static void write(StringBuilder sb, Object value) {
        if (value == null) {
            sb.append("null");
        } else if (value instanceof String) {
            sb.append('"');
            for (char c : ((String) value).toCharArray()) {
                if (c == '"' || c == '\\') {
                    sb.append('\\').append(c);
                } else if (c < 0x20) {
                    sb.append(String.format("\\u%04x", (int) c));
                } else {
                    sb.append(c);
                }
            }
            sb.append('"');
        } else if (value instanceof Number || value instanceof Boolean) {
            sb.append(value);
        } else if (value instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                write(sb, e.getKey().toString());
                sb.append(':');
                write(sb, e.getValue());
            }
            sb.append('}');
        } else if (value instanceof Collection) {
            sb.append('[');
            boolean first = true;
            for (Object item : (Collection<?>) value) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                write(sb, item);
            }
            sb.append(']');
        } else {
            write(sb, value.toString());
        }
    }
}
