package rebalancer.interop;

import java.io.File;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.hazelcast.config.Config;
import com.hazelcast.config.JoinConfig;
import com.hazelcast.core.Hazelcast;
import com.hazelcast.core.HazelcastInstance;
import com.hazelcast.instance.impl.HazelcastInstanceProxy;
import com.hazelcast.internal.partition.InternalPartition;
import com.hazelcast.internal.partition.MigrationInfo;
import com.hazelcast.internal.partition.PartitionReplica;
import com.hazelcast.internal.partition.impl.InternalPartitionServiceImpl;
import com.hazelcast.internal.partition.impl.MigrationInterceptor;
import com.hazelcast.partition.MigrationListener;
import com.hazelcast.partition.MigrationState;
import com.hazelcast.partition.ReplicaMigrationEvent;

/**
 * Runs membership changes on real Hazelcast 5.x members in this JVM, on loopback, and records every migration the
 * master commits (docs/INTEROP.md).
 *
 * <p>Usage: {@code HazelcastHarness script.json out.json}. Steps: {@code start} a member, {@code shutdown} one
 * (graceful: its replicas migrate away first), {@code terminate} one (a crash), {@code keys} (the partition of
 * String, Integer, Long and UUID keys from the public partition service). After each membership step the harness
 * waits until the partition service is safe (no migration queued or running, every backup in sync) and dumps the
 * replica table (replica indexes 0..6 of every partition, by member name), the migrations the master completed with
 * their replica indexes, the promotions after a crash, and the public {@link MigrationListener}'s counts.
 *
 * <p>Internal APIs used (test code only, Hazelcast 5.7): {@code InternalPartitionServiceImpl} (replica table,
 * {@code MigrationInterceptor} on the master: each migration's source and destination replica indexes, which tell
 * a data copy from a shift) reached through {@code HazelcastInstanceProxy.getOriginal().node}.
 */
public final class HazelcastHarness {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final JsonNode script;
    private final int basePort;
    private final Map<String, HazelcastInstance> running = new LinkedHashMap<>();
    private final Map<UUID, String> names = new ConcurrentHashMap<>();
    private final List<ObjectNode> migrations = new CopyOnWriteArrayList<>();
    private final AtomicInteger listenerCompleted = new AtomicInteger();
    private final AtomicInteger listenerFailed = new AtomicInteger();

    private HazelcastHarness(JsonNode script) {
        this.script = script;
        this.basePort = script.path("base_port").asInt(47500);
    }

    public static void main(String[] args) throws Exception {
        JsonNode script = JSON.readTree(new File(args[0]));
        ObjectNode out = JSON.createObjectNode();
        out.put("hazelcast_version", com.hazelcast.instance.BuildInfoProvider.getBuildInfo().getVersion());
        HazelcastHarness harness = new HazelcastHarness(script);
        ArrayNode dumps = out.putArray("steps");
        try {
            for (JsonNode step : script.path("steps")) {
                ObjectNode dump = dumps.addObject();
                dump.set("step", step);
                long t0 = System.nanoTime();
                harness.run(step, dump);
                harness.awaitSafe();
                dump.put("seconds", (System.nanoTime() - t0) / 1e9);
                harness.dump(dump, step.path("layout").asBoolean(true));
            }
        }
        finally {
            JSON.writeValue(new File(args[1]), out);
            Hazelcast.shutdownAll();
        }
        System.exit(0);
    }

    private void run(JsonNode step, ObjectNode dump) {
        String op = step.path("op").asText();
        String name = step.path("member").asText(null);
        switch (op) {
            case "start": start(name); break;
            case "shutdown": running.remove(name).shutdown(); break;
            case "terminate": running.remove(name).getLifecycleService().terminate(); break;
            case "keys": dump.set("partitions_of", keys(step)); break;
            default: throw new IllegalArgumentException("unknown op " + op);
        }
    }

    private void start(String name) {
        // A member may name its own partition count: it then forms its own cluster (the name includes the count).
        int partitions = script.path("member_partitions").path(name).asInt(script.path("partitions").asInt(271));
        Config cfg = new Config()
            .setInstanceName(name)
            .setClusterName("rebalancer-interop-" + basePort + "-" + partitions)
            .setProperty("hazelcast.partition.count", String.valueOf(partitions))
            .setProperty("hazelcast.logging.type", "jdk")
            .setProperty("hazelcast.heartbeat.interval.seconds", "1")
            .setProperty("hazelcast.max.no.heartbeat.seconds", "6")
            .setProperty("hazelcast.merge.first.run.delay.seconds", "3600");
        cfg.getMapConfig("default").setBackupCount(script.path("backups").asInt(1));
        cfg.getNetworkConfig().setPort(basePort).setPortAutoIncrement(true).setPortCount(20);
        cfg.getNetworkConfig().getInterfaces().setEnabled(true).addInterface("127.0.0.1");
        JoinConfig join = cfg.getNetworkConfig().getJoin();
        join.getMulticastConfig().setEnabled(false);
        join.getAutoDetectionConfig().setEnabled(false);
        join.getTcpIpConfig().setEnabled(true);
        for (int port = basePort; port < basePort + 20; port++) {
            join.getTcpIpConfig().addMember("127.0.0.1:" + port);
        }
        cfg.getJetConfig().setEnabled(false);

        HazelcastInstance hz = Hazelcast.newHazelcastInstance(cfg);
        names.put(hz.getCluster().getLocalMember().getUuid(), name);
        running.put(name, hz);
        hz.getPartitionService().addMigrationListener(new MigrationListener() {
            @Override public void migrationStarted(MigrationState state) { }
            @Override public void migrationFinished(MigrationState state) { }
            @Override public void replicaMigrationCompleted(ReplicaMigrationEvent event) {
                if (isMaster(hz)) {
                    listenerCompleted.incrementAndGet();
                }
            }
            @Override public void replicaMigrationFailed(ReplicaMigrationEvent event) {
                if (isMaster(hz)) {
                    listenerFailed.incrementAndGet();
                }
            }
        });
        // Internal API: the interceptor sees each migration with its replica indexes, before and after.
        service(hz).setMigrationInterceptor(new MigrationInterceptor() {
            @Override public void onMigrationComplete(MigrationParticipant who, MigrationInfo info, boolean ok) {
                if (who == MigrationParticipant.MASTER) {
                    migrations.add(row("MIGRATION", info, ok));
                }
            }
            @Override public void onPromotionComplete(MigrationParticipant who, Collection<MigrationInfo> infos,
                boolean ok) {
                // Promotions after a crash: recorded with the participant that saw them (deduplicated by the reader).
                for (MigrationInfo info : infos) {
                    migrations.add(row("PROMOTION", info, ok).put("participant", who.name()));
                }
            }
        });
    }

    private static boolean isMaster(HazelcastInstance hz) {
        return hz.getLifecycleService().isRunning() && hz.getCluster().getMembers().iterator().next().localMember();
    }

    private ObjectNode row(String kind, MigrationInfo info, boolean ok) {
        ObjectNode row = JSON.createObjectNode();
        row.put("kind", kind);
        row.put("partition", info.getPartitionId());
        row.put("source", name(info.getSource()));
        row.put("source_current", info.getSourceCurrentReplicaIndex());
        row.put("source_new", info.getSourceNewReplicaIndex());
        row.put("destination", name(info.getDestination()));
        row.put("destination_current", info.getDestinationCurrentReplicaIndex());
        row.put("destination_new", info.getDestinationNewReplicaIndex());
        row.put("success", ok);
        return row;
    }

    private String name(PartitionReplica replica) {
        return replica == null ? null : names.getOrDefault(replica.uuid(), replica.uuid().toString());
    }

    private static InternalPartitionServiceImpl service(HazelcastInstance hz) {
        return ((HazelcastInstanceProxy) hz).getOriginal().node.partitionService;
    }

    private HazelcastInstance master() {
        for (HazelcastInstance hz : running.values()) {
            if (isMaster(hz)) {
                return hz;
            }
        }
        throw new IllegalStateException("no master among " + running.keySet());
    }

    /** Waits until the member list agrees everywhere and no migration is queued, running or out of sync. */
    private void awaitSafe() throws InterruptedException {
        if (running.isEmpty()) {
            return;
        }
        long deadline = System.currentTimeMillis() + 600_000;
        int stable = 0;
        int seen = -1;
        while (System.currentTimeMillis() < deadline) {
            // The listener's events arrive asynchronously: wait until its count stopped moving too.
            int completed = listenerCompleted.get();
            boolean safe = completed == seen;
            seen = completed;
            for (HazelcastInstance hz : running.values()) {
                InternalPartitionServiceImpl svc = service(hz);
                safe &= hz.getCluster().getMembers().size() == clusterSize(hz);
                safe &= svc.getMigrationQueueSize() == 0 && !svc.hasOnGoingMigrationLocal();
                safe &= hz.getPartitionService().isLocalMemberSafe();
            }
            HazelcastInstance master = master();
            safe &= !service(master).hasOnGoingMigration() && master.getPartitionService().isClusterSafe();
            stable = safe ? stable + 1 : 0;
            if (stable >= 10) {
                return;
            }
            Thread.sleep(100);
        }
        throw new IllegalStateException("partitions did not become safe within 600 s");
    }

    /** How many running members share ``hz``'s cluster (members with their own partition count form their own). */
    private long clusterSize(HazelcastInstance hz) {
        String cluster = hz.getConfig().getClusterName();
        return running.values().stream().filter(m -> m.getConfig().getClusterName().equals(cluster)).count();
    }

    private void dump(ObjectNode dump, boolean layout) {
        ArrayNode rows = dump.putArray("migrations");
        synchronized (migrations) {
            migrations.forEach(rows::add);
            migrations.clear();
        }
        dump.put("listener_completed", listenerCompleted.getAndSet(0));
        dump.put("listener_failed", listenerFailed.getAndSet(0));
        ArrayNode members = dump.putArray("members");
        running.keySet().forEach(members::add);
        if (!layout || running.isEmpty()) {
            return;
        }
        InternalPartitionServiceImpl svc = service(master());
        ArrayNode table = dump.putArray("layout");
        for (int p = 0; p < svc.getPartitionCount(); p++) {
            InternalPartition part = svc.getPartition(p);
            ArrayNode replicas = table.addArray();
            for (int i = 0; i < InternalPartition.MAX_REPLICA_COUNT; i++) {
                replicas.add(name(part.getReplica(i)));
            }
        }
    }

    private ObjectNode keys(JsonNode step) {
        // The public partition service: the partition the real member maps a key to.
        String member = step.path("member").asText(running.keySet().iterator().next());
        var ps = running.get(member).getPartitionService();
        ObjectNode out = JSON.createObjectNode();
        ArrayNode strings = out.putArray("string");
        step.path("string").forEach(k -> strings.add(ps.getPartition(k.asText()).getPartitionId()));
        ArrayNode ints = out.putArray("int");
        step.path("int").forEach(k -> ints.add(ps.getPartition(k.asInt()).getPartitionId()));
        ArrayNode longs = out.putArray("long");
        step.path("long").forEach(k -> longs.add(ps.getPartition(k.asLong()).getPartitionId()));
        ArrayNode uuids = out.putArray("uuid");
        step.path("uuid").forEach(k -> uuids.add(ps.getPartition(UUID.fromString(k.asText())).getPartitionId()));
        return out;
    }
}
