package rebalancer.interop;

import java.io.File;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.ignite.Ignite;
import org.apache.ignite.IgniteCache;
import org.apache.ignite.Ignition;
import org.apache.ignite.cache.CacheMode;
import org.apache.ignite.cache.PartitionLossPolicy;
import org.apache.ignite.cache.affinity.rendezvous.ClusterNodeAttributeAffinityBackupFilter;
import org.apache.ignite.cache.affinity.rendezvous.RendezvousAffinityFunction;
import org.apache.ignite.cluster.ClusterNode;
import org.apache.ignite.cluster.ClusterState;
import org.apache.ignite.configuration.CacheConfiguration;
import org.apache.ignite.configuration.DataRegionConfiguration;
import org.apache.ignite.configuration.DataStorageConfiguration;
import org.apache.ignite.configuration.IgniteConfiguration;
import org.apache.ignite.events.DiscoveryEvent;
import org.apache.ignite.events.EventType;
import org.apache.ignite.internal.IgniteEx;
import org.apache.ignite.internal.IgniteNodeAttributes;
import org.apache.ignite.internal.events.DiscoveryCustomEvent;
import org.apache.ignite.internal.processors.affinity.AffinityAssignment;
import org.apache.ignite.internal.processors.affinity.AffinityTopologyVersion;
import org.apache.ignite.internal.processors.affinity.GridAffinityAssignmentCache;
import org.apache.ignite.internal.processors.cache.CacheGroupContext;
import org.apache.ignite.internal.processors.cache.distributed.dht.preloader.GridDhtPartitionsExchangeFuture;
import org.apache.ignite.internal.processors.cache.distributed.dht.topology.GridDhtLocalPartition;
import org.apache.ignite.internal.processors.cache.distributed.dht.topology.GridDhtPartitionState;
import org.apache.ignite.internal.util.typedef.internal.CU;
import org.apache.ignite.failure.NoOpFailureHandler;
import org.apache.ignite.logger.java.JavaLogger;
import org.apache.ignite.spi.communication.tcp.TcpCommunicationSpi;
import org.apache.ignite.spi.discovery.tcp.TcpDiscoverySpi;
import org.apache.ignite.spi.discovery.tcp.ipfinder.vm.TcpDiscoveryVmIpFinder;

/**
 * Runs a script of cluster steps against real Apache Ignite 2.x server nodes in this JVM, on loopback, and writes
 * what every exchange decided as JSON (docs/INTEROP.md describes the script and the dump).
 *
 * <p>Usage: {@code IgniteHarness script.json out.json}. Every step waits for the cluster to settle (the exchanges
 * it caused are done on every node, the ready affinity version is stable), then dumps: the exchanges completed since
 * the previous dump, the new affinity versions with the ideal and the serving assignment per cache, every server
 * node's local partitions (state, update counter, size) and the lost partitions per cache.
 *
 * <p>Caches use {@code rebalanceDelay = -1}: data moves only on a {@code rebalance} step, so MOVING copies and
 * temporary primaries stay visible in the dump of the step that created them.
 *
 * <p>Internal APIs used (test code only, Ignite 2.18): {@code IgniteEx.context()}, {@code CacheGroupContext},
 * {@code GridAffinityAssignmentCache} (affinity history: ideal and late assignment per version),
 * {@code GridDhtPartitionTopology.localPartitions()} and the exchange manager's futures.
 */
public final class IgniteHarness {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final JsonNode script;
    private final int basePort;
    private final boolean persistence;
    private final String workDir;
    private final Map<String, Ignite> running = new LinkedHashMap<>();
    private final Map<String, JsonNode> caches = new LinkedHashMap<>();
    private final List<String> startedCaches = new ArrayList<>();
    private AffinityTopologyVersion lastExchange = AffinityTopologyVersion.NONE;
    private final Map<String, AffinityTopologyVersion> lastAffinity = new HashMap<>();
    /** Custom discovery messages by the topology version they arrived at ("major.minor" -> description). */
    private final Map<String, ObjectNode> customs = new java.util.concurrent.ConcurrentHashMap<>();

    private IgniteHarness(JsonNode script) {
        this.script = script;
        this.basePort = script.path("base_port").asInt(47500);
        this.persistence = script.path("persistence").asBoolean(false);
        this.workDir = script.path("work_dir").asText(System.getProperty("java.io.tmpdir") + "/ignite-harness");
        script.path("caches").fields().forEachRemaining(e -> caches.put(e.getKey(), e.getValue()));
    }

    public static void main(String[] args) throws Exception {
        JsonNode script = JSON.readTree(new File(args[0]));
        ObjectNode out = JSON.createObjectNode();
        out.put("ignite_version", org.apache.ignite.internal.IgniteVersionUtils.VER_STR);
        IgniteHarness harness = new IgniteHarness(script);
        ArrayNode dumps = out.putArray("steps");
        try {
            for (JsonNode step : script.path("steps")) {
                ObjectNode dump = dumps.addObject();
                dump.set("step", step);
                try {
                    harness.run(step, dump);
                }
                catch (Exception e) {
                    if (!step.path("expect_failure").asBoolean(false)) {
                        throw e;
                    }
                    Throwable root = e;
                    while (root.getCause() != null) {
                        root = root.getCause();
                    }
                    dump.put("error", root.getMessage());
                    harness.running.remove(step.path("node").asText());
                }
                harness.settle();
                harness.dump(dump);
            }
        }
        finally {
            out.putPOJO("custom_messages", new TreeMap<>(harness.customs));
            JSON.writerWithDefaultPrettyPrinter().writeValue(new File(args[1]), out);
            Ignition.stopAll(true);
        }
        System.exit(0);
    }

    // ---- steps ----

    private void run(JsonNode step, ObjectNode dump) throws Exception {
        String op = step.path("op").asText();
        String name = step.path("node").asText(null);
        switch (op) {
            case "start": startNode(name, false); break;
            case "client": startNode(name, true); break;
            case "stop": Ignition.stop(name, false); running.remove(name); forgetIfDown(); break;
            case "kill": kill(name); forgetIfDown(); break;
            case "stop_all": Ignition.stopAll(true); running.clear(); forgetIfDown(); break;
            case "start_cache": startCache(step.path("cache").asText()); break;
            case "stop_cache":
                coordinator().destroyCache(step.path("cache").asText());
                startedCaches.remove(step.path("cache").asText());
                break;
            case "put": put(step.path("cache").asText(), step.path("keys").asInt(), step.path("from").asInt(0)); break;
            case "rebalance": rebalance(); break;
            case "reset_lost": coordinator().resetLostPartitions(List.of(step.path("cache").asText())); break;
            case "activate": coordinator().cluster().state(ClusterState.ACTIVE); break;
            case "baseline": coordinator().cluster().setBaselineTopology(coordinator().cluster().topologyVersion()); break;
            case "keys": dump.set("partitions_of", keys(step)); break;
            default: throw new IllegalArgumentException("unknown op " + op);
        }
    }

    private void startNode(String name, boolean client) {
        JsonNode spec = script.path("nodes").path(name);
        IgniteConfiguration cfg = new IgniteConfiguration()
            .setIgniteInstanceName(name)
            // A persistent Ignite node generates a java.util.UUID consistent id; a configured one is usually a String.
            .setConsistentId(spec.path("uuid_consistent_id").asBoolean(false) ? UUID.fromString(name) : name)
            .setClientMode(client)
            .setLocalHost("127.0.0.1")
            .setGridLogger(new JavaLogger())
            // A killed node's discovery worker ends "unexpectedly"; the default handler would halt this whole JVM.
            .setFailureHandler(new NoOpFailureHandler())
            .setMetricsLogFrequency(0)
            .setWorkDirectory(workDir)
            .setClientConnectorConfiguration(null)   // no thin-client port (10800)
            .setConnectorConfiguration(null)         // no REST port
            .setPeerClassLoadingEnabled(false)
            .setIncludeEventTypes(EventType.EVT_NODE_JOINED, EventType.EVT_NODE_LEFT, EventType.EVT_NODE_FAILED);

        Map<String, Object> attrs = new HashMap<>();
        spec.path("attributes").fields().forEachRemaining(e -> attrs.put(e.getKey(), e.getValue().asText()));
        // Every node of this JVM has the same MAC addresses, so all would be neighbours. Ignite reads this user
        // attribute instead of the real MACs when present (IgniteNodeAttributes.ATTR_MACS_OVERRIDE): it is the host.
        attrs.put(IgniteNodeAttributes.ATTR_MACS_OVERRIDE, spec.path("host").asText("host-" + name));
        cfg.setUserAttributes(attrs);

        TcpDiscoveryVmIpFinder finder = new TcpDiscoveryVmIpFinder();
        finder.setAddresses(List.of("127.0.0.1:" + basePort + ".." + (basePort + 19)));
        TcpDiscoverySpi disco = new TcpDiscoverySpi().setIpFinder(finder);
        disco.setLocalPort(basePort);
        disco.setLocalPortRange(20);
        cfg.setDiscoverySpi(disco);
        TcpCommunicationSpi comm = new TcpCommunicationSpi();
        comm.setLocalPort(basePort + 50);
        comm.setLocalPortRange(20);
        cfg.setCommunicationSpi(comm);

        DataRegionConfiguration region = new DataRegionConfiguration()
            .setName("default")
            .setInitialSize(16L << 20)
            .setMaxSize(64L << 20)
            .setPersistenceEnabled(persistence);
        DataStorageConfiguration storage = new DataStorageConfiguration().setDefaultDataRegionConfiguration(region);
        if (persistence) {
            storage.setWalSegmentSize(4 << 20).setWalSegments(2);
        }
        cfg.setDataStorageConfiguration(storage);
        Ignite ig = Ignition.start(cfg);
        running.put(name, ig);
        listen((IgniteEx) ig);
    }

    /**
     * Records which custom discovery messages arrived at which version (internal API: exchange futures drop their
     * first event's message once done). A CacheAffinityChangeMessage is the late-affinity switch; its
     * assignmentChange names the cache groups whose primaries it changes.
     */
    private void listen(IgniteEx ig) {
        var disco = ig.context().discovery();
        disco.setCustomEventListener(org.apache.ignite.internal.processors.cache.CacheAffinityChangeMessage.class,
            (topVer, snd, msg) -> {
                ObjectNode row = JSON.createObjectNode();
                row.put("message", "CacheAffinityChangeMessage");
                row.put("exchange_needed", msg.exchangeNeeded());
                ArrayNode groups = row.putArray("groups");
                if (msg.assignmentChange() != null) {
                    for (Integer grpId : msg.assignmentChange().keySet()) {
                        groups.add(caches.keySet().stream().filter(c -> CU.cacheId(c) == grpId).findFirst()
                            .orElse("system:" + grpId));
                    }
                }
                customs.putIfAbsent(topVer.topologyVersion() + "." + topVer.minorTopologyVersion(), row);
            });
        disco.setCustomEventListener(org.apache.ignite.internal.processors.cache.DynamicCacheChangeBatch.class,
            (topVer, snd, msg) -> customs.putIfAbsent(topVer.topologyVersion() + "." + topVer.minorTopologyVersion(),
                JSON.createObjectNode().put("message", "DynamicCacheChangeBatch")));
    }

    /** When the last server is gone the in-memory cluster is gone: a later start begins a new history. */
    private void forgetIfDown() {
        if (servers().isEmpty()) {
            for (String name : List.copyOf(running.keySet())) {
                Ignition.stop(name, true);
            }
            running.clear();
            startedCaches.clear();
            lastAffinity.clear();
            customs.clear();
            lastExchange = AffinityTopologyVersion.NONE;
        }
    }

    /** A crash: the node stops answering discovery at once, the others declare it failed (EVT_NODE_FAILED). */
    private void kill(String name) throws Exception {
        Ignite victim = running.remove(name);
        UUID id = victim.cluster().localNode().id();
        ((TcpDiscoverySpi) victim.configuration().getDiscoverySpi()).simulateNodeFailure();
        Ignite survivor = coordinator();
        ((IgniteEx) survivor).context().discovery().failNode(id, "killed by the interop harness");
        Thread stopper = new Thread(() -> Ignition.stop(name, true));
        stopper.setDaemon(true);
        stopper.start();
        stopper.join(TimeUnit.SECONDS.toMillis(30));
    }

    private CacheConfiguration<Object, Object> cacheConfig(String name) {
        JsonNode spec = caches.get(name);
        RendezvousAffinityFunction aff = new RendezvousAffinityFunction(
            spec.path("exclude_neighbors").asBoolean(false), spec.path("partitions").asInt(1024));
        if (spec.has("backup_filter")) {
            List<String> attrs = new ArrayList<>();
            spec.path("backup_filter").forEach(a -> attrs.add(a.asText()));
            aff.setAffinityBackupFilter(new ClusterNodeAttributeAffinityBackupFilter(attrs.toArray(new String[0])));
        }
        CacheConfiguration<Object, Object> cfg = new CacheConfiguration<>(name);
        cfg.setAffinity(aff)
            .setCacheMode(CacheMode.valueOf(spec.path("mode").asText("PARTITIONED")))
            .setBackups(spec.path("backups").asInt(0))
            .setPartitionLossPolicy(PartitionLossPolicy.valueOf(spec.path("loss_policy").asText("READ_WRITE_SAFE")))
            .setRebalanceDelay(-1);  // manual rebalancing only: the `rebalance` step (deprecated, still honoured)
        return cfg;
    }

    private void startCache(String name) {
        startedCaches.add(name);
        coordinator().getOrCreateCache(cacheConfig(name));
    }

    private void put(String cache, int keys, int from) {
        Map<Integer, String> batch = new TreeMap<>();
        for (int k = from; k < from + keys; k++) {
            batch.put(k, "value-" + k);
        }
        coordinator().cache(cache).putAll(batch);
    }

    /** Starts the manual rebalance everywhere and waits until no copy is MOVING or RENTING and affinity is ideal. */
    private void rebalance() throws Exception {
        for (Ignite ig : servers()) {
            for (String cache : startedCaches) {
                ig.cache(cache).rebalance().get();
            }
        }
        long deadline = System.currentTimeMillis() + 60_000;
        while (System.currentTimeMillis() < deadline) {
            boolean busy = false;
            for (Ignite ig : servers()) {
                for (String cache : startedCaches) {
                    CacheGroupContext grp = group(ig, cache);
                    for (GridDhtLocalPartition part : grp.topology().localPartitions()) {
                        GridDhtPartitionState st = part.state();
                        busy |= st == GridDhtPartitionState.MOVING || st == GridDhtPartitionState.RENTING;
                    }
                    AffinityAssignment aff = grp.affinity().lastReadyAffinity();
                    busy |= !aff.assignment().equals(aff.idealAssignment());
                }
            }
            if (!busy) {
                return;
            }
            Thread.sleep(100);
        }
        throw new IllegalStateException("rebalance did not finish within 60 s");
    }

    private ObjectNode keys(JsonNode step) {
        // Ignite's public affinity API: the partition the real cluster maps a key to.
        org.apache.ignite.cache.affinity.Affinity<Object> aff = coordinator().affinity(step.path("cache").asText());
        ObjectNode out = JSON.createObjectNode();
        ArrayNode strings = out.putArray("string");
        step.path("string").forEach(k -> strings.add(aff.partition(k.asText())));
        ArrayNode ints = out.putArray("int");
        step.path("int").forEach(k -> ints.add(aff.partition(k.asInt())));
        ArrayNode longs = out.putArray("long");
        step.path("long").forEach(k -> longs.add(aff.partition(k.asLong())));
        ArrayNode uuids = out.putArray("uuid");
        step.path("uuid").forEach(k -> uuids.add(aff.partition(UUID.fromString(k.asText()))));
        return out;
    }

    // ---- waiting and dumping ----

    private List<Ignite> servers() {
        List<Ignite> out = new ArrayList<>();
        for (Ignite ig : running.values()) {
            if (!ig.cluster().localNode().isClient()) {
                out.add(ig);
            }
        }
        out.sort(Comparator.comparingLong(ig -> ig.cluster().localNode().order()));
        return out;
    }

    /** The oldest running server: Ignite's coordinator, which holds the longest affinity and exchange history. */
    private Ignite coordinator() {
        return servers().get(0);
    }

    private static CacheGroupContext group(Ignite ig, String cache) {
        return ((IgniteEx) ig).context().cache().cacheGroup(CU.cacheId(cache));
    }

    /**
     * Waits until every node sees as many nodes as are running, has finished the exchanges of the last step (its
     * ready affinity version is at its topology version) and the ready version held for 500 ms. Without the first
     * two, a departure noticed late (a stopped coordinator's handover on a loaded machine, say) could have its
     * exchange reported in the next step.
     */
    private void settle() throws Exception {
        if (running.isEmpty()) {
            return;
        }
        AffinityTopologyVersion seen = null;
        long stableSince = System.currentTimeMillis();
        long deadline = stableSince + 60_000;
        while (System.currentTimeMillis() < deadline) {
            boolean done = true;
            AffinityTopologyVersion ver = null;
            for (Ignite ig : running.values()) {
                var exch = ((IgniteEx) ig).context().cache().context().exchange();
                GridDhtPartitionsExchangeFuture last = exch.lastTopologyFuture();
                done &= last == null || last.isDone();  // null on an inactive persistent cluster
                done &= ig.cluster().nodes().size() == running.size();
                AffinityTopologyVersion v = exch.readyAffinityVersion();
                done &= last == null || v.topologyVersion() == ig.cluster().topologyVersion();
                if (ver == null || v.compareTo(ver) > 0) {
                    ver = v;
                }
            }
            if (!done || ver == null || !ver.equals(seen)) {
                seen = ver;
                stableSince = System.currentTimeMillis();
            }
            else if (System.currentTimeMillis() - stableSince >= 500) {
                return;
            }
            Thread.sleep(50);
        }
        throw new IllegalStateException("cluster did not settle within 60 s");
    }

    private void dump(ObjectNode dump) {
        if (running.isEmpty() || servers().isEmpty()) {
            return;
        }
        Ignite crd = coordinator();
        ArrayNode nodes = dump.putArray("nodes");
        for (Ignite ig : running.values()) {
            ClusterNode n = ig.cluster().localNode();
            ObjectNode row = nodes.addObject();
            row.put("node_id", String.valueOf(n.consistentId()));
            row.put("node_uuid", n.id().toString());
            row.put("node_order", n.order());
            row.put("is_client", n.isClient());
            row.put("host", String.valueOf((Object) n.attribute(IgniteNodeAttributes.ATTR_MACS_OVERRIDE)));
            ObjectNode attrs = row.putObject("attributes");
            script.path("nodes").path(ig.name()).path("attributes").fields()
                .forEachRemaining(e -> attrs.put(e.getKey(), String.valueOf((Object) n.attribute(e.getKey()))));
        }

        ArrayNode exchanges = dump.putArray("exchanges");
        List<GridDhtPartitionsExchangeFuture> futs = new ArrayList<>(
            ((IgniteEx) crd).context().cache().context().exchange().exchangeFutures());
        futs.sort(Comparator.comparing(GridDhtPartitionsExchangeFuture::initialVersion));
        AffinityTopologyVersion newest = lastExchange;
        for (GridDhtPartitionsExchangeFuture fut : futs) {
            if (!fut.isDone() || fut.initialVersion().compareTo(lastExchange) <= 0) {
                continue;
            }
            ObjectNode row = exchanges.addObject();
            row.set("initial", version(fut.initialVersion()));
            row.set("result", version(fut.topologyVersion()));
            row.put("merged", fut.isMerged());
            DiscoveryEvent evt = fut.firstEvent();
            row.put("event", evt.name());
            row.put("event_node", String.valueOf(evt.eventNode().consistentId()));
            ObjectNode custom = customs.get(fut.initialVersion().topologyVersion() + "."
                + fut.initialVersion().minorTopologyVersion());
            if (evt instanceof DiscoveryCustomEvent && custom != null) {
                row.setAll(custom);
            }
            newest = fut.initialVersion();
        }
        lastExchange = newest;

        ObjectNode affinity = dump.putObject("affinity");
        ObjectNode partitions = dump.putObject("partitions");
        ObjectNode lost = dump.putObject("lost");
        ObjectNode probes = dump.putObject("access");
        for (String cache : startedCaches) {
            CacheGroupContext grp = group(crd, cache);
            GridAffinityAssignmentCache aff = grp.affinity();
            ArrayNode versions = affinity.putArray(cache);
            AffinityTopologyVersion last = lastAffinity.getOrDefault(cache, AffinityTopologyVersion.NONE);
            for (AffinityTopologyVersion v : aff.cachedVersions()) {
                if (v.compareTo(last) <= 0) {
                    continue;
                }
                AffinityAssignment a = aff.cachedAffinity(v);
                ObjectNode row = versions.addObject();
                row.set("version", version(v));
                row.set("ideal", lists(a.idealAssignment()));
                row.set("assignment", lists(a.assignment()));
                last = v;
            }
            lastAffinity.put(cache, last);

            ArrayNode lostRows = lost.putArray(cache);
            Collection<Integer> lostParts = crd.cache(cache).lostPartitions();
            lostParts.stream().sorted().forEach(lostRows::add);
            if (!lostParts.isEmpty()) {
                probes.set(cache, probe(crd, cache, lostParts));
            }

            ObjectNode perNode = partitions.putObject(cache);
            for (Ignite ig : servers()) {
                ArrayNode rows = perNode.putArray(ig.name());
                List<GridDhtLocalPartition> parts = new ArrayList<>(group(ig, cache).topology().localPartitions());
                parts.sort(Comparator.comparingInt(GridDhtLocalPartition::id));
                for (GridDhtLocalPartition part : parts) {
                    ArrayNode r = rows.addArray();
                    r.add(part.id()).add(part.state().name()).add(part.updateCounter()).add(part.fullSize());
                }
            }
        }
    }

    /**
     * What the loss policy lets a client do: a read and a write of a key in a lost partition and of a key in a
     * partition that is not lost (each true when the operation succeeded).
     */
    private static ObjectNode probe(Ignite ig, String cache, Collection<Integer> lostParts) {
        org.apache.ignite.cache.affinity.Affinity<Object> aff = ig.affinity(cache);
        Integer lostKey = null;
        Integer okKey = null;
        for (int k = 0; k < 1_000_000 && (lostKey == null || okKey == null); k++) {
            if (lostParts.contains(aff.partition(k))) {
                lostKey = lostKey == null ? k : lostKey;
            }
            else {
                okKey = okKey == null ? k : okKey;
            }
        }
        IgniteCache<Object, Object> c = ig.cache(cache);
        final Integer lostKey0 = lostKey;
        final Integer okKey0 = okKey;
        ObjectNode out = JSON.createObjectNode();
        out.put("lost_read", attempt(() -> c.get(lostKey0)));
        out.put("lost_write", attempt(() -> c.put(lostKey0, "probe")));
        if (okKey0 != null) {
            out.put("other_read", attempt(() -> c.get(okKey0)));
            out.put("other_write", attempt(() -> c.put(okKey0, "probe")));
        }
        return out;
    }

    private static boolean attempt(Runnable op) {
        try {
            op.run();
            return true;
        }
        catch (RuntimeException e) {
            return false;
        }
    }

    private static ArrayNode version(AffinityTopologyVersion v) {
        return JSON.createArrayNode().add(v.topologyVersion()).add(v.minorTopologyVersion());
    }

    private static ArrayNode lists(List<List<ClusterNode>> assignment) {
        ArrayNode out = JSON.createArrayNode();
        for (List<ClusterNode> nodes : assignment) {
            ArrayNode row = out.addArray();
            nodes.forEach(n -> row.add(String.valueOf(n.consistentId())));
        }
        return out;
    }
}
