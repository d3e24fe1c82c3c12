package rebalancer.interop.live;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.UUID;
import java.util.concurrent.TimeUnit;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.ignite.Ignite;
import org.apache.ignite.Ignition;
import org.apache.ignite.cache.CacheAtomicityMode;
import org.apache.ignite.cache.CacheMode;
import org.apache.ignite.cache.PartitionLossPolicy;
import org.apache.ignite.cache.affinity.rendezvous.ClusterNodeAttributeAffinityBackupFilter;
import org.apache.ignite.cache.affinity.rendezvous.RendezvousAffinityFunction;
import org.apache.ignite.cluster.ClusterNode;
import org.apache.ignite.cluster.ClusterState;
import org.apache.ignite.configuration.CacheConfiguration;
import org.apache.ignite.configuration.ClientConnectorConfiguration;
import org.apache.ignite.configuration.DataRegionConfiguration;
import org.apache.ignite.configuration.DataStorageConfiguration;
import org.apache.ignite.configuration.IgniteConfiguration;
import org.apache.ignite.failure.NoOpFailureHandler;
import org.apache.ignite.internal.IgniteEx;
import org.apache.ignite.internal.IgniteNodeAttributes;
import org.apache.ignite.internal.processors.affinity.AffinityAssignment;
import org.apache.ignite.internal.processors.affinity.AffinityTopologyVersion;
import org.apache.ignite.internal.processors.cache.CacheGroupContext;
import org.apache.ignite.internal.processors.cache.GridCacheContext;
import org.apache.ignite.internal.processors.cache.distributed.dht.preloader.GridDhtPartitionsExchangeFuture;
import org.apache.ignite.internal.processors.cache.distributed.dht.topology.GridDhtLocalPartition;
import org.apache.ignite.internal.processors.cache.distributed.dht.topology.GridDhtPartitionState;
import org.apache.ignite.internal.processors.cache.persistence.IgniteCacheDatabaseSharedManager;
import org.apache.ignite.logger.java.JavaLogger;
import org.apache.ignite.spi.discovery.tcp.TcpDiscoverySpi;
import org.apache.ignite.spi.discovery.tcp.ipfinder.vm.TcpDiscoveryVmIpFinder;
import org.apache.ignite.spi.communication.tcp.TcpCommunicationSpi;

/**
 * A live Apache Ignite 2.17 cluster in one JVM, driven one command at a time so that a test can read the running
 * cluster through its public interfaces (thin client + SQL system views, control utility) between steps, and compare
 * with the truth this JVM reads from Ignite's internals.
 *
 * <p>Usage: {@code IgniteLiveCluster <base_port> <work_dir>}. Reads one JSON command per line on stdin and writes
 * exactly one JSON line per command on stdout (Ignite's own console output is sent to stderr). Every answer is the
 * dump below, taken after the cluster settled, plus {@code op} and {@code ms}; a failed command answers
 * {@code {"op": ..., "error": "..."}} (plus the dump when one can be taken) and the JVM keeps running.
 * End of input, or {@code {"op": "shutdown"}}, stops every node and exits.
 *
 * <p>Ports on 127.0.0.1: discovery base..base+19, communication base+50..base+69, thin client base+100..base+119
 * (each node binds the first free one; the dump says which).
 *
 * <p>Commands (fields other than {@code op} optional unless said):
 * <ul>
 * <li>{@code start} {node (required), consistent_id (default: the node name; JSON null lets Ignite generate one,
 *     a UUID when persistence is on), host (the node's host, default "host-<node>"), attributes {name: string},
 *     persistence (bool; fixed by the first start of the JVM, default false)}: starts a server node.</li>
 * <li>{@code stop} {node}: graceful stop. {@code kill} {node}: a crash: the node stops answering discovery, the
 *     coordinator declares it failed (EVT_NODE_FAILED), then the instance is cancelled.</li>
 * <li>{@code activate}, {@code deactivate}, {@code baseline} (set to the current server topology),
 *     {@code baseline_auto_adjust} {enabled, timeout_ms}.</li>
 * <li>{@code start_cache} {name (required), group, partitions (1024), backups (0), mode (PARTITIONED|REPLICATED),
 *     atomicity (ATOMIC|TRANSACTIONAL), loss_policy (READ_WRITE_SAFE), exclude_neighbors (false), backup_filter
 *     [attribute names] (ClusterNodeAttributeAffinityBackupFilter), rebalance_delay (0; -1 = only on a
 *     {@code rebalance} command)}. {@code stop_cache} {name}.</li>
 * <li>{@code put} {cache, keys: N, from (0)}: integer keys from..from+N-1, values "value-k".</li>
 * <li>{@code rebalance} {cache (default: every user cache)}: starts the rebalance on every node and waits until no
 *     copy is MOVING or RENTING and the serving assignment is the ideal one.</li>
 * <li>{@code reset_lost} {caches: [names]}.</li>
 * <li>{@code diverge} {cache, partition, node, delta (1, at least 1), mode ("counter" | "entries")}: makes one
 *     copy differ from the others. "counter" raises that copy's update counter by delta; "entries" also writes delta
 *     new entries straight into that copy's data store (as if it alone had applied delta updates: size and content
 *     differ too). The answer's {@code diverged} holds counter and size before and after, and the keys written.</li>
 * <li>{@code dump}: just the dump.</li>
 * </ul>
 *
 * <p>The dump: {@code topology_version} [major, minor] (the coordinator's ready affinity version; on an inactive
 * cluster, which runs no exchange, the discovery version and 0),
 * {@code cluster_state}, {@code coordinator}, {@code baseline} (consistent ids, null before the first activation),
 * {@code baseline_auto_adjust}, {@code nodes} (every node ever started: name, consistent_id, node_id, order,
 * thin_port, host, attributes, alive), {@code groups} (per user cache group: its caches and configuration,
 * {@code ideal} and {@code late} assignment per partition as consistent-id lists, and {@code local}: per live
 * server node, [partition, state, update counter, size] of each local partition), {@code lost} (per cache),
 * {@code settled} (false when automatic rebalancing had not finished within 30 s).
 *
 * <p>Settling: every node sees the same topology and finished its exchanges (as IgniteHarness), and every cache group
 * with automatic rebalancing has no MOVING or RENTING copy and serves its ideal assignment (unless a group with
 * {@code rebalance_delay} -1 still has MOVING copies: Ignite then holds the late-affinity switch of every group until
 * a {@code rebalance}); all held for 500 ms.
 *
 * <p>Internal APIs used (test code only, Ignite 2.17): {@code IgniteEx.context()}, {@code CacheGroupContext}
 * (affinity: ideal and late assignment; topology: local partitions), the exchange manager's futures,
 * {@code GridDhtLocalPartition.updateCounter(long)}, {@code IgniteCacheOffheapManager.update},
 * {@code TcpDiscoverySpi.simulateNodeFailure} and {@code GridDiscoveryManager.failNode}.
 */
public final class IgniteLiveCluster {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final long SETTLE_MS = 60_000;
    private static final long REBALANCE_WAIT_MS = 30_000;

    private final int basePort;
    private final String workDir;
    private Boolean persistence;
    private final Map<String, Ignite> running = new LinkedHashMap<>();
    /** Every node ever started, by name: its last known row in the dump ({@code alive} false once gone). */
    private final Map<String, ObjectNode> known = new LinkedHashMap<>();

    private IgniteLiveCluster(int basePort, String workDir) {
        this.basePort = basePort;
        this.workDir = workDir;
    }

    public static void main(String[] args) throws Exception {
        // Ignite prints its banner and quiet-mode lines on System.out: keep the real stdout for answers only.
        PrintStream answers = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        IgniteLiveCluster cluster = new IgniteLiveCluster(Integer.parseInt(args[0]), args[1]);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isBlank()) {
                    continue;
                }
                ObjectNode answer = cluster.handle(line);
                answers.println(JSON.writeValueAsString(answer));
                if ("shutdown".equals(answer.path("op").asText())) {
                    break;
                }
            }
        }
        finally {
            Ignition.stopAll(true);
        }
        System.exit(0);
    }

    /** One command: run it, settle, dump. Never throws: a failure becomes the answer's {@code error}. */
    private ObjectNode handle(String line) {
        long started = System.nanoTime();
        ObjectNode answer = JSON.createObjectNode();
        try {
            JsonNode cmd = JSON.readTree(line);
            String op = cmd.path("op").asText();
            answer.put("op", op);
            if (op.equals("shutdown")) {
                return answer;
            }
            run(op, cmd, answer);
            answer.put("settled", settle());
            dump(answer);
        }
        catch (Throwable e) {
            answer.put("error", describe(e));
            try {
                dump(answer);
            }
            catch (Throwable ignored) {
                // The error is the answer; a dump is a bonus.
            }
        }
        answer.put("ms", TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started));
        return answer;
    }

    private void run(String op, JsonNode cmd, ObjectNode answer) throws Exception {
        String node = cmd.path("node").asText(null);
        switch (op) {
            case "start": start(cmd); break;
            case "stop": stop(required(node)); break;
            case "kill": kill(required(node)); break;
            case "activate": coordinator().cluster().state(ClusterState.ACTIVE); break;
            case "deactivate": coordinator().cluster().state(ClusterState.INACTIVE); break;
            case "baseline":
                coordinator().cluster().setBaselineTopology(coordinator().cluster().topologyVersion());
                break;
            case "baseline_auto_adjust":
                coordinator().cluster().baselineAutoAdjustEnabled(cmd.path("enabled").asBoolean(true));
                if (cmd.has("timeout_ms")) {
                    coordinator().cluster().baselineAutoAdjustTimeout(cmd.path("timeout_ms").asLong());
                }
                break;
            case "start_cache": coordinator().getOrCreateCache(cacheConfig(cmd)); break;
            case "stop_cache": coordinator().destroyCache(cmd.path("name").asText()); break;
            case "put": put(cmd.path("cache").asText(), cmd.path("keys").asInt(), cmd.path("from").asInt(0)); break;
            case "rebalance": rebalance(cmd.path("cache").asText(null)); break;
            case "reset_lost":
                List<String> caches = new ArrayList<>();
                cmd.path("caches").forEach(c -> caches.add(c.asText()));
                coordinator().resetLostPartitions(caches);
                break;
            case "diverge": answer.set("diverged", diverge(cmd)); break;
            case "dump": break;
            default: throw new IllegalArgumentException("unknown op " + op);
        }
    }

    private static String required(String node) {
        if (node == null) {
            throw new IllegalArgumentException("missing field: node");
        }
        return node;
    }

    // ---- nodes ----

    private void start(JsonNode cmd) {
        String name = required(cmd.path("node").asText(null));
        boolean persistent = cmd.path("persistence").asBoolean(persistence != null && persistence);
        if (persistence != null && persistence != persistent) {
            throw new IllegalArgumentException("persistence is " + persistence + " for this cluster");
        }
        persistence = persistent;

        IgniteConfiguration cfg = new IgniteConfiguration()
            .setIgniteInstanceName(name)
            .setLocalHost("127.0.0.1")
            .setGridLogger(new JavaLogger())
            // A killed node's discovery worker ends "unexpectedly"; the default handler would halt this whole JVM.
            .setFailureHandler(new NoOpFailureHandler())
            .setMetricsLogFrequency(0)
            .setWorkDirectory(workDir)
            .setConnectorConfiguration(null)  // no REST: the control utility of 2.17 uses the thin-client port
            .setPeerClassLoadingEnabled(false)
            .setClientConnectorConfiguration(new ClientConnectorConfiguration()
                .setHost("127.0.0.1").setPort(basePort + 100).setPortRange(20));
        JsonNode cid = cmd.get("consistent_id");
        if (cid == null) {
            cfg.setConsistentId(name);
        }
        else if (!cid.isNull()) {
            cfg.setConsistentId(cid.asText());
        }

        Map<String, Object> attrs = new HashMap<>();
        cmd.path("attributes").fields().forEachRemaining(e -> attrs.put(e.getKey(), e.getValue().asText()));
        // All nodes of this JVM share the machine's MAC addresses, so all would be neighbours. Ignite reads this
        // attribute instead of the real MACs when present (IgniteNodeAttributes.ATTR_MACS_OVERRIDE): it is the host.
        attrs.put(IgniteNodeAttributes.ATTR_MACS_OVERRIDE, cmd.path("host").asText("host-" + name));
        cfg.setUserAttributes(attrs);

        TcpDiscoveryVmIpFinder finder = new TcpDiscoveryVmIpFinder();
        finder.setAddresses(List.of("127.0.0.1:" + basePort + ".." + (basePort + 19)));
        cfg.setDiscoverySpi(new TcpDiscoverySpi().setIpFinder(finder).setLocalPort(basePort).setLocalPortRange(20));
        TcpCommunicationSpi comm = new TcpCommunicationSpi();
        comm.setLocalPort(basePort + 50);
        comm.setLocalPortRange(20);
        cfg.setCommunicationSpi(comm);

        DataRegionConfiguration region = new DataRegionConfiguration()
            .setName("default")
            .setInitialSize(16L << 20)
            .setMaxSize(64L << 20)
            .setPersistenceEnabled(persistent);
        DataStorageConfiguration storage = new DataStorageConfiguration().setDefaultDataRegionConfiguration(region);
        if (persistent) {
            storage.setWalSegmentSize(4 << 20).setWalSegments(2);
        }
        cfg.setDataStorageConfiguration(storage);

        IgniteEx ig = (IgniteEx) Ignition.start(cfg);
        running.put(name, ig);
        ClusterNode local = ig.cluster().localNode();
        ObjectNode row = JSON.createObjectNode();
        row.put("name", name);
        row.put("consistent_id", String.valueOf(local.consistentId()));
        row.put("node_id", local.id().toString());
        row.put("order", local.order());
        row.put("thin_port", ig.context().clientListener().port());
        row.put("host", String.valueOf(attrs.get(IgniteNodeAttributes.ATTR_MACS_OVERRIDE)));
        ObjectNode userAttrs = row.putObject("attributes");
        cmd.path("attributes").fields().forEachRemaining(e -> userAttrs.put(e.getKey(), e.getValue().asText()));
        row.put("alive", true);
        known.put(name, row);
    }

    /** A graceful stop: the node leaves the topology (EVT_NODE_LEFT) after its operations finish. */
    private void stop(String name) {
        if (running.remove(name) == null) {
            throw new IllegalArgumentException("no running node " + name);
        }
        Ignition.stop(name, false);
    }

    /** A crash, as IgniteHarness: the node stops answering discovery at once, the others declare it failed. */
    private void kill(String name) throws Exception {
        Ignite victim = running.remove(name);
        if (victim == null) {
            throw new IllegalArgumentException("no running node " + name);
        }
        UUID id = victim.cluster().localNode().id();
        ((TcpDiscoverySpi) victim.configuration().getDiscoverySpi()).simulateNodeFailure();
        if (!servers().isEmpty()) {
            ((IgniteEx) coordinator()).context().discovery().failNode(id, "killed by IgniteLiveCluster");
        }
        Thread stopper = new Thread(() -> Ignition.stop(name, true));
        stopper.setDaemon(true);
        stopper.start();
        stopper.join(TimeUnit.SECONDS.toMillis(30));
    }

    private List<Ignite> servers() {
        List<Ignite> out = new ArrayList<>(running.values());
        out.sort(Comparator.comparingLong(ig -> ig.cluster().localNode().order()));
        return out;
    }

    /** The oldest running server: Ignite's coordinator. */
    private Ignite coordinator() {
        List<Ignite> servers = servers();
        if (servers.isEmpty()) {
            throw new IllegalStateException("no node is running");
        }
        return servers.get(0);
    }

    // ---- caches ----

    private static CacheConfiguration<Object, Object> cacheConfig(JsonNode cmd) {
        RendezvousAffinityFunction aff = new RendezvousAffinityFunction(
            cmd.path("exclude_neighbors").asBoolean(false), cmd.path("partitions").asInt(1024));
        if (cmd.has("backup_filter")) {
            List<String> attrs = new ArrayList<>();
            cmd.path("backup_filter").forEach(a -> attrs.add(a.asText()));
            aff.setAffinityBackupFilter(new ClusterNodeAttributeAffinityBackupFilter(attrs.toArray(new String[0])));
        }
        CacheConfiguration<Object, Object> cfg = new CacheConfiguration<>(cmd.path("name").asText());
        cfg.setAffinity(aff)
            .setGroupName(cmd.path("group").asText(null))
            .setCacheMode(CacheMode.valueOf(cmd.path("mode").asText("PARTITIONED")))
            .setAtomicityMode(CacheAtomicityMode.valueOf(cmd.path("atomicity").asText("ATOMIC")))
            .setBackups(cmd.path("backups").asInt(0))
            .setPartitionLossPolicy(PartitionLossPolicy.valueOf(cmd.path("loss_policy").asText("READ_WRITE_SAFE")))
            .setRebalanceDelay(cmd.path("rebalance_delay").asLong(0));  // deprecated, still honoured in 2.17
        return cfg;
    }

    private void put(String cache, int keys, int from) {
        Map<Integer, String> batch = new TreeMap<>();
        for (int k = from; k < from + keys; k++) {
            batch.put(k, "value-" + k);
        }
        coordinator().cache(cache).putAll(batch);
    }

    /** User cache groups as the coordinator knows them, by group id (an inactive cluster has none). */
    private static Map<Integer, CacheGroupContext> groups(Ignite ig) {
        Map<Integer, CacheGroupContext> out = new TreeMap<>();
        for (CacheGroupContext grp : ((IgniteEx) ig).context().cache().cacheGroups()) {
            if (grp.userCache()) {
                out.put(grp.groupId(), grp);
            }
        }
        return out;
    }

    private static CacheGroupContext group(Ignite ig, int grpId) {
        return ((IgniteEx) ig).context().cache().cacheGroup(grpId);
    }

    private void rebalance(String cache) throws Exception {
        List<String> caches = cache != null ? List.of(cache) : new ArrayList<>(coordinator().cacheNames());
        for (Ignite ig : servers()) {
            for (String c : caches) {
                ig.cache(c).rebalance().get();
            }
        }
        long deadline = System.currentTimeMillis() + SETTLE_MS;
        while (!rebalanced(false)) {
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("rebalance did not finish within 60 s");
            }
            Thread.sleep(100);
        }
    }

    /**
     * True when no copy is MOVING or RENTING and every group serves its ideal assignment. With {@code autoOnly},
     * only groups that rebalance by themselves (rebalance delay 0) count, and while a group that rebalances only on
     * demand still has MOVING copies their serving assignment is not waited for: Ignite switches the late affinity
     * of all groups at once, when every group has finished, so that group holds the switch of the others.
     */
    private boolean rebalanced(boolean autoOnly) {
        Map<Integer, CacheGroupContext> groups = groups(coordinator());
        boolean held = autoOnly && groups.values().stream()
            .anyMatch(g -> g.config().getRebalanceDelay() != 0 && moving(g.groupId()));
        for (CacheGroupContext grp : groups.values()) {
            if (autoOnly && grp.config().getRebalanceDelay() != 0) {
                continue;
            }
            AffinityAssignment aff = grp.affinity().lastReadyAffinity();
            if (aff == null || aff.idealAssignment() == null) {
                continue;  // no affinity yet: an inactive cluster that kept its groups from disk
            }
            if (moving(grp.groupId()) || (!held && !aff.assignment().equals(aff.idealAssignment()))) {
                return false;
            }
        }
        return true;
    }

    /** Whether some server holds a MOVING or RENTING copy of the group. */
    private boolean moving(int grpId) {
        for (Ignite ig : servers()) {
            CacheGroupContext grp = group(ig, grpId);
            if (grp == null) {
                continue;
            }
            for (GridDhtLocalPartition part : grp.topology().localPartitions()) {
                GridDhtPartitionState st = part.state();
                if (st == GridDhtPartitionState.MOVING || st == GridDhtPartitionState.RENTING) {
                    return true;
                }
            }
        }
        return false;
    }

    /**
     * Makes one copy of a partition differ from the others (see the class comment). Entries go straight into the
     * copy's data store, under the checkpoint read lock a persistent region needs; no other copy hears of them.
     */
    private ObjectNode diverge(JsonNode cmd) throws Exception {
        String cache = cmd.path("cache").asText();
        int partId = cmd.path("partition").asInt();
        long delta = cmd.path("delta").asLong(1);
        String mode = cmd.path("mode").asText("counter");
        if (delta < 1) {
            throw new IllegalArgumentException("delta must be at least 1 (Ignite's counters only move forward)");
        }
        if (!mode.equals("counter") && !mode.equals("entries")) {
            throw new IllegalArgumentException("mode must be counter or entries");
        }
        IgniteEx ig = (IgniteEx) running.get(required(cmd.path("node").asText(null)));
        if (ig == null) {
            throw new IllegalArgumentException("no running node " + cmd.path("node").asText());
        }
        GridCacheContext<Object, Object> cctx = ig.cachex(cache).context();
        GridDhtLocalPartition part = cctx.topology().localPartition(partId);
        if (part == null) {
            throw new IllegalArgumentException("node " + ig.name() + " holds no copy of partition " + partId);
        }
        ObjectNode out = JSON.createObjectNode();
        out.put("node", ig.name()).put("partition", partId).put("mode", mode);
        out.put("counter_before", part.updateCounter()).put("size_before", part.fullSize());
        ArrayNode keys = out.putArray("keys");
        IgniteCacheDatabaseSharedManager db = ig.context().cache().context().database();
        db.checkpointReadLock();
        try {
            if (mode.equals("entries")) {
                var aff = ig.affinity(cache);
                long topVer = ig.cluster().topologyVersion();
                // Keys far above what `put` writes, so they are new to every copy.
                for (int k = 1_000_000_000; keys.size() < delta; k++) {
                    if (aff.partition(k) == partId) {
                        cctx.offheap().update(cctx, cctx.toCacheKeyObject(k), cctx.toCacheObject("diverged-" + k),
                            cctx.versions().next(topVer), 0L, part, null);
                        keys.add(k);
                    }
                }
            }
            part.updateCounter(part.updateCounter() + delta);
        }
        finally {
            db.checkpointReadUnlock();
        }
        out.put("counter_after", part.updateCounter()).put("size_after", part.fullSize());
        return out;
    }

    // ---- settling and dumping ----

    /**
     * Waits (hard, 60 s) until every node sees all running nodes and finished its exchanges, and (soft, 30 s from
     * the start) until groups that rebalance by themselves are done; everything must hold for 500 ms, so a late
     * affinity switch or an eviction that follows a rebalance is waited for too. Returns false when the soft wait
     * ran out: the dump then shows the rebalance in flight.
     */
    private boolean settle() throws Exception {
        if (running.isEmpty()) {
            return true;
        }
        long start = System.currentTimeMillis();
        AffinityTopologyVersion seen = null;
        long stableSince = start;
        while (true) {
            boolean exchanged = exchangesDone();
            boolean moved = exchanged && rebalanced(true);
            AffinityTopologyVersion ver = readyVersion();
            long now = System.currentTimeMillis();
            if (!exchanged || !moved || !ver.equals(seen)) {
                seen = ver;
                stableSince = now;
            }
            else if (now - stableSince >= 500) {
                return true;
            }
            if (!exchanged && now - start > SETTLE_MS) {
                throw new IllegalStateException("cluster did not settle within 60 s");
            }
            if (exchanged && !moved && now - start > REBALANCE_WAIT_MS) {
                return false;
            }
            Thread.sleep(50);
        }
    }

    private boolean exchangesDone() {
        for (Ignite ig : running.values()) {
            var exch = ((IgniteEx) ig).context().cache().context().exchange();
            GridDhtPartitionsExchangeFuture last = exch.lastTopologyFuture();
            if (ig.cluster().nodes().size() != running.size()) {
                return false;
            }
            if (last != null) {  // null on an inactive persistent cluster
                if (!last.isDone() || exch.readyAffinityVersion().topologyVersion() != ig.cluster().topologyVersion()) {
                    return false;
                }
            }
        }
        return true;
    }

    private AffinityTopologyVersion readyVersion() {
        return ((IgniteEx) coordinator()).context().cache().context().exchange().readyAffinityVersion();
    }

    private void dump(ObjectNode dump) {
        for (ObjectNode row : known.values()) {
            row.put("alive", running.containsKey(row.path("name").asText()));
        }
        dump.putArray("nodes").addAll(known.values());
        if (running.isEmpty()) {
            return;
        }
        Ignite crd = coordinator();
        // No exchange has run on an inactive persistent cluster: its version is then discovery's, minor 0.
        AffinityTopologyVersion ver = readyVersion();
        long major = ver.topologyVersion() > 0 ? ver.topologyVersion() : crd.cluster().topologyVersion();
        dump.putArray("topology_version").add(major).add(ver.topologyVersion() > 0 ? ver.minorTopologyVersion() : 0);
        dump.put("cluster_state", crd.cluster().state().name());
        dump.put("coordinator", crd.name());
        if (crd.cluster().currentBaselineTopology() == null) {
            dump.putNull("baseline");
        }
        else {
            ArrayNode baseline = dump.putArray("baseline");
            crd.cluster().currentBaselineTopology().stream().map(n -> String.valueOf(n.consistentId())).sorted()
                .forEach(baseline::add);
        }
        dump.putObject("baseline_auto_adjust")
            .put("enabled", crd.cluster().isBaselineAutoAdjustEnabled())
            .put("timeout_ms", crd.cluster().baselineAutoAdjustTimeout());

        ObjectNode groups = dump.putObject("groups");
        ObjectNode lost = dump.putObject("lost");
        for (CacheGroupContext grp : groups(crd).values()) {
            CacheConfiguration<?, ?> cfg = grp.config();
            ObjectNode g = groups.putObject(grp.cacheOrGroupName());
            g.put("group_id", grp.groupId());
            ArrayNode names = g.putArray("caches");
            grp.caches().stream().map(GridCacheContext::name).sorted().forEach(names::add);
            g.put("mode", cfg.getCacheMode().name());
            g.put("backups", cfg.getBackups());
            g.put("partitions", grp.affinity().partitions());
            g.put("loss_policy", cfg.getPartitionLossPolicy().name());
            g.put("rebalance_delay", cfg.getRebalanceDelay());
            g.put("persistent", grp.persistenceEnabled());
            AffinityAssignment aff = grp.affinity().lastReadyAffinity();
            if (aff != null && aff.idealAssignment() != null) {
                g.set("affinity_version", JSON.createArrayNode()
                    .add(aff.topologyVersion().topologyVersion()).add(aff.topologyVersion().minorTopologyVersion()));
                g.set("ideal", lists(aff.idealAssignment()));
                g.set("late", lists(aff.assignment()));
            }
            ObjectNode local = g.putObject("local");
            for (Ignite ig : servers()) {
                CacheGroupContext own = group(ig, grp.groupId());
                ArrayNode rows = local.putArray(ig.name());
                if (own == null) {
                    continue;
                }
                List<GridDhtLocalPartition> parts = new ArrayList<>(own.topology().localPartitions());
                parts.sort(Comparator.comparingInt(GridDhtLocalPartition::id));
                for (GridDhtLocalPartition part : parts) {
                    rows.addArray().add(part.id()).add(part.state().name()).add(part.updateCounter())
                        .add(part.fullSize());
                }
            }
            for (GridCacheContext<?, ?> cctx : grp.caches()) {
                if (crd.cluster().state() == ClusterState.INACTIVE) {
                    break;  // an inactive cluster refuses every cache operation
                }
                ArrayNode rows = lost.putArray(cctx.name());
                crd.cache(cctx.name()).lostPartitions().stream().sorted().forEach(rows::add);
            }
        }
    }

    private static ArrayNode lists(List<List<ClusterNode>> assignment) {
        ArrayNode out = JSON.createArrayNode();
        for (List<ClusterNode> nodes : assignment) {
            ArrayNode row = out.addArray();
            nodes.forEach(n -> row.add(String.valueOf(n.consistentId())));
        }
        return out;
    }

    /** The exception and its causes in one line: Ignite wraps the telling message several levels deep. */
    private static String describe(Throwable e) {
        StringBuilder out = new StringBuilder();
        for (Throwable t = e; t != null && out.length() < 2000; t = t.getCause()) {
            out.append(out.length() == 0 ? "" : " <- ").append(t.getClass().getSimpleName()).append(": ")
                .append(t.getMessage());
        }
        return out.toString();
    }
}
