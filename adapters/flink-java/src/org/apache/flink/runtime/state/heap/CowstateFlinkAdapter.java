/*
 * Flink's own CopyOnWriteStateMap behind cowstate's process protocol
 * (docs/protocol.md, version 1), so cowstate's differential runner checks it
 * against the reference model: cowstate check --implementation flink-java.
 *
 * Built by `make flink-adapter` against the flink-dist jar of the
 * apache-flink-libraries wheel (pinned in adapters/flink-java/requirements.txt).
 * It lives in Flink's package to reach the map's package-private parts (the
 * private capacity constructor by reflection, the rehash state, snapshot
 * release): it calls the map, it copies none of it.
 *
 * How it keeps the protocol's promises:
 * - States are JSON-like Java objects (Integer, String, ArrayList, LinkedHashMap,
 *   and an immutable Tuple); the state serializer's copy() is a deep copy, as a
 *   TypeSerializer of mutable states must be (the map calls it for rule S).
 * - Handles are numbers from an identity registry, cleared by create: equal
 *   handles are the same object.
 * - A state in a result is converted (copied) when its operation returns.
 * - An exception of a transform function is a refusal; any other exception
 *   inside the map is a crash (its stack trace), which ends the batch.
 * - Only protocol lines go to standard output (System.out is redirected to
 *   standard error before the map's classes load).
 */
package org.apache.flink.runtime.state.heap;

import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputView;
import org.apache.flink.runtime.state.StateEntry;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.lang.reflect.Constructor;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.ConcurrentModificationException;
import java.util.IdentityHashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Objects;

public final class CowstateFlinkAdapter {

    private static final ObjectMapper JSON = new ObjectMapper();
    private static final int PROTOCOL = 1;

    /** A key whose hash code is chosen; equal to another exactly when the values are. */
    static final class HashKey {
        final Object value;
        final int hash;

        HashKey(Object value, int hash) {
            this.value = value;
            this.hash = hash;
        }

        @Override
        public boolean equals(Object other) {
            return other instanceof HashKey && Objects.equals(value, ((HashKey) other).value);
        }

        @Override
        public int hashCode() {
            return hash;
        }

        @Override
        public String toString() {
            return "HashKey(" + value + ", " + hash + ")";
        }
    }

    /** An immutable sequence (what add_or_append makes of a string). */
    static final class Tuple {
        final List<Object> items;

        Tuple(List<Object> items) {
            this.items = items;
        }

        @Override
        public boolean equals(Object other) {
            return other instanceof Tuple && items.equals(((Tuple) other).items);
        }

        @Override
        public int hashCode() {
            return items.hashCode();
        }
    }

    /** The serializer of JSON-like states: copy() is a deep copy. Never writes bytes. */
    static final class JsonStateSerializer extends TypeSerializer<Object> {
        private static final long serialVersionUID = 1L;

        @Override
        public boolean isImmutableType() {
            return false;
        }

        @Override
        public TypeSerializer<Object> duplicate() {
            return this;
        }

        @Override
        public Object createInstance() {
            return null;
        }

        @Override
        public Object copy(Object from) {
            return deepCopy(from);
        }

        @Override
        public Object copy(Object from, Object reuse) {
            return deepCopy(from);
        }

        @Override
        public int getLength() {
            return -1;
        }

        @Override
        public void serialize(Object record, DataOutputView target) {
            throw new UnsupportedOperationException("the adapter never serializes");
        }

        @Override
        public Object deserialize(DataInputView source) {
            throw new UnsupportedOperationException("the adapter never deserializes");
        }

        @Override
        public Object deserialize(Object reuse, DataInputView source) {
            throw new UnsupportedOperationException("the adapter never deserializes");
        }

        @Override
        public void copy(DataInputView source, DataOutputView target) {
            throw new UnsupportedOperationException("the adapter never copies bytes");
        }

        @Override
        public boolean equals(Object obj) {
            return obj instanceof JsonStateSerializer;
        }

        @Override
        public int hashCode() {
            return 17;
        }

        @Override
        public TypeSerializerSnapshot<Object> snapshotConfiguration() {
            throw new UnsupportedOperationException("the adapter writes no snapshots");
        }
    }

    /** What a transform function throws: a refusal, not a crash. */
    static final class Refused extends RuntimeException {
        Refused(String message) {
            super(message);
        }
    }

    private final Constructor<?> constructor;
    private final Field rehashIndex;
    private final Field primaryTable;
    private CopyOnWriteStateMap<Object, Object, Object> map;
    private final Map<Object, CopyOnWriteStateMapSnapshot<Object, Object, Object>> snapshots =
            new LinkedHashMap<>();
    private final IdentityHashMap<Object, Long> handles = new IdentityHashMap<>();

    CowstateFlinkAdapter() throws ReflectiveOperationException {
        constructor = CopyOnWriteStateMap.class.getDeclaredConstructor(int.class, TypeSerializer.class);
        constructor.setAccessible(true);
        rehashIndex = CopyOnWriteStateMap.class.getDeclaredField("rehashIndex");
        rehashIndex.setAccessible(true);
        primaryTable = CopyOnWriteStateMap.class.getDeclaredField("primaryTable");
        primaryTable.setAccessible(true);
    }

    // ------------------------------------------------------------------ values

    static Object deepCopy(Object value) {
        if (value instanceof List) {
            List<Object> copy = new ArrayList<>();
            for (Object item : (List<?>) value) {
                copy.add(deepCopy(item));
            }
            return copy;
        }
        if (value instanceof Map) {
            Map<Object, Object> copy = new LinkedHashMap<>();
            for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
                copy.put(e.getKey(), deepCopy(e.getValue()));
            }
            return copy;
        }
        return value; // Integer, String, Tuple: immutable
    }

    /** A state as JSON, copied now. */
    static Object wire(Object state) {
        if (state instanceof Tuple) {
            List<Object> items = new ArrayList<>();
            for (Object item : ((Tuple) state).items) {
                items.add(wire(item));
            }
            Map<String, Object> tagged = new LinkedHashMap<>();
            tagged.put("tuple", items);
            return tagged;
        }
        if (state instanceof List || state instanceof Map) {
            return deepCopy(state);
        }
        return state;
    }

    static Object key(Object wire) {
        if (wire instanceof Map) {
            List<?> pair = (List<?>) ((Map<?, ?>) wire).get("HashKey");
            return new HashKey(pair.get(0), ((Number) pair.get(1)).intValue());
        }
        return wire;
    }

    static Object wireKey(Object key) {
        if (key instanceof HashKey) {
            HashKey k = (HashKey) key;
            Map<String, Object> tagged = new LinkedHashMap<>();
            tagged.put("HashKey", List.of(k.value, k.hash));
            return tagged;
        }
        return key;
    }

    @SuppressWarnings("unchecked")
    static void mutate(Object state, Object item) {
        if (state instanceof List) {
            ((List<Object>) state).add(item);
        } else if (state instanceof Map) {
            ((Map<Object, Object>) state).put("m" + item, item);
        }
    }

    static Object transformFunction(String name, Object old, Object value) {
        switch (name) {
            case "add_or_append":
                if (old == null) {
                    List<Object> fresh = new ArrayList<>();
                    fresh.add(value);
                    return fresh;
                }
                if (old instanceof Integer) {
                    return (Integer) old + ((Number) value).intValue();
                }
                if (old instanceof List || old instanceof Map) {
                    mutate(old, value);
                    return old;
                }
                return new Tuple(List.of(old, value));
            case "replace_with_value":
                return value;
            case "raise_error":
                throw new Refused("transform refuses " + value);
            case "return_none":
                return null;
            default:
                throw new IllegalArgumentException("unknown transform function " + name);
        }
    }

    private Object handle(Object state) {
        if (state == null) {
            return null;
        }
        return handles.computeIfAbsent(state, s -> (long) handles.size() + 1);
    }

    private List<Object> held(Object state) {
        if (state == null) {
            return null;
        }
        List<Object> out = new ArrayList<>(2);
        out.add(handle(state));
        out.add(wire(state));
        return out;
    }

    private List<Object> entry(StateEntry<Object, Object, Object> e) {
        List<Object> out = new ArrayList<>(3);
        out.add(wireKey(e.getKey()));
        out.add(wireKey(e.getNamespace()));
        out.add(wire(e.getState()));
        return out;
    }

    private List<Object> entries(Iterator<StateEntry<Object, Object, Object>> it) {
        List<Object> out = new ArrayList<>();
        while (it.hasNext()) {
            out.add(entry(it.next()));
        }
        return out;
    }

    private List<Object> snapshotEntries(CopyOnWriteStateMapSnapshot<Object, Object, Object> s) {
        return entries(s.getIterator(null, null, null, null));
    }

    private Object rehash() throws IllegalAccessException {
        if (!map.isRehashing()) {
            return false;
        }
        Object[] table = (Object[]) primaryTable.get(map);
        return List.of(rehashIndex.getInt(map), table.length);
    }

    // -------------------------------------------------------------- operations

    @SuppressWarnings("unchecked")
    Object apply(List<Object> op) throws Exception {
        String name = (String) op.get(0);
        switch (name) {
            case "create": {
                for (CopyOnWriteStateMapSnapshot<Object, Object, Object> s : snapshots.values()) {
                    s.release();
                }
                snapshots.clear();
                handles.clear();
                Object capacity = op.get(1);
                int initial = capacity == null ? CopyOnWriteStateMap.DEFAULT_CAPACITY : ((Number) capacity).intValue();
                map = (CopyOnWriteStateMap<Object, Object, Object>) constructor.newInstance(initial, new JsonStateSerializer());
                return null;
            }
            case "put": {
                Object state = op.get(3);
                map.put(key(op.get(1)), key(op.get(2)), state);
                return listOf(null, handle(state));
            }
            case "get":
                return held(map.get(key(op.get(1)), key(op.get(2))));
            case "get_and_mutate": {
                Object state = map.get(key(op.get(1)), key(op.get(2)));
                if (state != null) {
                    mutate(state, op.get(3));
                }
                return held(state);
            }
            case "contains_key":
                return map.containsKey(key(op.get(1)), key(op.get(2)));
            case "put_and_get_old": {
                Object state = op.get(3);
                Object old = map.putAndGetOld(key(op.get(1)), key(op.get(2)), state);
                if (old != null) {
                    mutate(old, op.get(4));
                }
                return listOf(held(old), handle(state));
            }
            case "remove":
                map.remove(key(op.get(1)), key(op.get(2)));
                return null;
            case "remove_and_get_old": {
                Object old = map.removeAndGetOld(key(op.get(1)), key(op.get(2)));
                if (old != null) {
                    mutate(old, op.get(3));
                }
                return held(old);
            }
            case "transform": {
                final Object[] seen = new Object[2];
                final String function = (String) op.get(4);
                map.transform(
                        key(op.get(1)),
                        key(op.get(2)),
                        op.get(3),
                        (old, value) -> {
                            seen[0] = old;
                            seen[1] = transformFunction(function, old, value);
                            return seen[1];
                        });
                return listOf(handle(seen[0]), handle(seen[1]));
            }
            case "snapshot": {
                Object progress = rehash();
                snapshots.put(op.get(1), map.stateSnapshot());
                return progress;
            }
            case "release": {
                CopyOnWriteStateMapSnapshot<Object, Object, Object> s = snapshots.remove(op.get(1));
                List<Object> out = snapshotEntries(s);
                s.release();
                return out;
            }
            case "snapshots": {
                List<Object> out = new ArrayList<>();
                for (Map.Entry<Object, CopyOnWriteStateMapSnapshot<Object, Object, Object>> e : snapshots.entrySet()) {
                    out.add(listOf(e.getKey(), snapshotEntries(e.getValue())));
                }
                return out;
            }
            case "iterate":
                return entries(map.iterator());
            case "keys": {
                List<Object> out = new ArrayList<>();
                map.getKeys(key(op.get(1))).forEach(k -> out.add(wireKey(k)));
                return out;
            }
            case "interrupt_iteration": {
                boolean rehashing = map.isRehashing();
                Iterator<StateEntry<Object, Object, Object>> it = map.iterator();
                int take = ((Number) op.get(1)).intValue() % (map.size() + 1);
                List<Object> seen = new ArrayList<>();
                for (int i = 0; i < take && it.hasNext(); i++) {
                    seen.add(entry(it.next()));
                }
                Object result = applyOrRefuse((List<Object>) op.get(2));
                Object step;
                List<Object> rest = new ArrayList<>();
                try {
                    step = entry(it.next()); // next(), not hasNext(): it checks the modification count first
                } catch (NoSuchElementException end) {
                    step = "end";
                } catch (ConcurrentModificationException failed) {
                    step = "failed";
                }
                if (!(step instanceof String)) {
                    try {
                        while (it.hasNext()) {
                            rest.add(entry(it.next()));
                        }
                    } catch (ConcurrentModificationException failed) {
                        rest.add("failed");
                    }
                }
                return listOf(seen, result, rehashing, step, rest);
            }
            default:
                throw new IllegalArgumentException("unknown operation " + name);
        }
    }

    Object applyOrRefuse(List<Object> op) throws Exception {
        try {
            return apply(op);
        } catch (Refused refused) {
            Map<String, Object> error = new LinkedHashMap<>();
            error.put("error", "refused");
            error.put("message", refused.getMessage());
            return error;
        }
    }

    static List<Object> listOf(Object... items) {
        List<Object> out = new ArrayList<>(items.length);
        for (Object item : items) {
            out.add(item);
        }
        return out;
    }

    // ---------------------------------------------------------------- the loop

    @SuppressWarnings("unchecked")
    public static void main(String[] args) throws Exception {
        PrintStream protocol = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        System.setOut(System.err); // nothing but protocol lines on standard output
        CowstateFlinkAdapter adapter = new CowstateFlinkAdapter();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            Map<String, Object> request;
            Map<String, Object> answer = new LinkedHashMap<>();
            try {
                request = JSON.readValue(line, Map.class);
            } catch (Exception e) {
                answer.put("id", null);
                answer.put("error", "expected a JSON request: " + e.getMessage());
                protocol.println(JSON.writeValueAsString(answer));
                protocol.flush();
                continue;
            }
            answer.put("id", request.get("id"));
            if (request.containsKey("hello")) {
                List<Object> offered = (List<Object>) ((Map<String, Object>) request.get("hello")).get("protocol");
                if (!offered.contains(PROTOCOL)) {
                    answer.put("error", "expected protocol " + PROTOCOL + ", got " + offered);
                } else {
                    Map<String, Object> hello = new LinkedHashMap<>();
                    hello.put("protocol", PROTOCOL);
                    hello.put("implementation", "Flink CopyOnWriteStateMap " + flinkVersion());
                    Map<String, Object> capabilities = new LinkedHashMap<>();
                    capabilities.put("put_reports_insert", false); // put is void
                    capabilities.put("state_handles", true);
                    capabilities.put("rehash_visible", true);
                    hello.put("capabilities", capabilities);
                    answer.put("hello", hello);
                }
            } else {
                List<Object> results = new ArrayList<>();
                List<Object> sizes = new ArrayList<>();
                for (Object op : (List<Object>) request.get("ops")) {
                    try {
                        results.add(adapter.applyOrRefuse((List<Object>) op));
                    } catch (Throwable crash) {
                        StringWriter trace = new StringWriter();
                        crash.printStackTrace(new PrintWriter(trace));
                        Map<String, Object> error = new LinkedHashMap<>();
                        error.put("error", "crashed");
                        error.put("message", trace.toString());
                        results.add(error);
                        sizes.add(adapter.map == null ? -1 : adapter.map.size());
                        break;
                    }
                    sizes.add(adapter.map == null ? -1 : adapter.map.size());
                }
                answer.put("results", results);
                answer.put("sizes", sizes);
            }
            protocol.println(JSON.writeValueAsString(answer));
            protocol.flush();
        }
    }

    static String flinkVersion() {
        try {
            return org.apache.flink.runtime.util.EnvironmentInformation.getVersion();
        } catch (Throwable e) {
            return "(version unknown)";
        }
    }
}
