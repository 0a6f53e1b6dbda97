// Key-group test vectors for cowstate.key_groups, computed by Java itself.
//
// Run (Java 17+, no compilation step, no dependencies):
//
//     java tests/java/KeyGroupVectors.java > tests/data/key_group_vectors.json
//
// The key-group arithmetic below is written from the prose of Flink's
// algorithm (MathUtils.bitMix / murmurHash, KeyGroupRangeAssignment; see
// shared reference "flink-state-map.md" section 2): Murmur3's finalizer, one
// Murmur3 round made non-negative, then modulo the max parallelism. The key
// hashes are the REAL java.lang / java.util ones (Integer, Long, String,
// Boolean, Double, Arrays.hashCode(byte[])); a Flink Tuple2 hashes as
// 31 * hash(f0) + hash(f1), a null field counting 0.
//
// Output: one JSON object, one vector per line. Values are encoded so Python
// can rebuild them exactly: integers as decimal strings, strings as their
// UTF-16 code units (and as an ASCII JSON string with \\u escapes), doubles
// as the decimal string of their raw IEEE-754 bits, byte arrays as signed
// bytes.

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

public class KeyGroupVectors {

    static final int[] MAX_PARALLELISMS = {1, 7, 10, 128, 32768};

    // ------------------------------------------------------------ the algorithm

    /** Murmur3's 32-bit finalizer; int arithmetic wraps, >>> is the logical shift. */
    static int bitMix(int x) {
        x = x ^ (x >>> 16);
        x = x * 0x85ebca6b;
        x = x ^ (x >>> 13);
        x = x * 0xc2b2ae35;
        x = x ^ (x >>> 16);
        return x;
    }

    /** One Murmur3 round over a single int, then bitMix, then made non-negative. */
    static int murmurHash(int code) {
        int c = code * 0xcc9e2d51;
        c = Integer.rotateLeft(c, 15);
        c = c * 0x1b873593;
        c = Integer.rotateLeft(c, 13);
        c = c * 5 + 0xe6546b64;
        c = c ^ 4;
        c = bitMix(c);
        if (c >= 0) {
            return c;
        }
        if (c != Integer.MIN_VALUE) {
            return -c;
        }
        return 0;
    }

    static int keyGroupForHash(int hash, int maxParallelism) {
        return murmurHash(hash) % maxParallelism;
    }

    /** Inclusive [start, end]: start = ceil(i * maxP / p), end = floor(((i + 1) * maxP - 1) / p). */
    static int[] rangeForOperator(int maxParallelism, int parallelism, int index) {
        int start = (index * maxParallelism + parallelism - 1) / parallelism;
        int end = ((index + 1) * maxParallelism - 1) / parallelism;
        return new int[] {start, end};
    }

    static int operatorForKeyGroup(int maxParallelism, int parallelism, int keyGroup) {
        return keyGroup * parallelism / maxParallelism;
    }

    /** Smallest power of two >= x (x >= 1): decrement, smear the bits right, increment. */
    static int roundUpToPowerOfTwo(int x) {
        x = x - 1;
        x |= x >> 1;
        x |= x >> 2;
        x |= x >> 4;
        x |= x >> 8;
        x |= x >> 16;
        return x + 1;
    }

    static int defaultMaxParallelism(int parallelism) {
        return Math.min(Math.max(roundUpToPowerOfTwo(parallelism + parallelism / 2), 128), 32768);
    }

    static int tuple2Hash(Object f0, Object f1) {
        int result = f0 == null ? 0 : f0.hashCode();
        return 31 * result + (f1 == null ? 0 : f1.hashCode());
    }

    // ------------------------------------------------------------------ output

    static final List<String> KEYS = new ArrayList<>();

    /** An ASCII JSON string literal: everything outside printable ASCII as a \\u escape. */
    static String quote(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20 || c > 0x7e) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }

    static String units(String s) {
        StringBuilder out = new StringBuilder("[");
        for (int i = 0; i < s.length(); i++) {
            if (i > 0) {
                out.append(", ");
            }
            out.append((int) s.charAt(i));
        }
        return out.append(']').toString();
    }

    static void key(String type, String encoded, int hash) {
        StringBuilder groups = new StringBuilder("{");
        for (int i = 0; i < MAX_PARALLELISMS.length; i++) {
            if (i > 0) {
                groups.append(", ");
            }
            groups.append('"').append(MAX_PARALLELISMS[i]).append("\": ")
                  .append(keyGroupForHash(hash, MAX_PARALLELISMS[i]));
        }
        groups.append('}');
        KEYS.add("{\"type\": \"" + type + "\", " + encoded + ", \"hash\": " + hash
                 + ", \"bit_mix\": " + bitMix(hash) + ", \"murmur\": " + murmurHash(hash)
                 + ", \"key_groups\": " + groups + "}");
    }

    static void intKey(int v) {
        key("int", "\"value\": \"" + v + "\"", Integer.valueOf(v).hashCode());
    }

    static void longKey(long v) {
        key("long", "\"value\": \"" + v + "\"", Long.valueOf(v).hashCode());
    }

    static void stringKey(String s) {
        key("string", "\"units\": " + units(s) + ", \"text\": " + quote(s), s.hashCode());
    }

    static void booleanKey(boolean b) {
        key("boolean", "\"value\": " + b, Boolean.valueOf(b).hashCode());
    }

    static void doubleKey(double d) {
        key("double", "\"bits\": \"" + Double.doubleToRawLongBits(d) + "\", \"text\": \""
            + Double.toString(d) + "\"", Double.valueOf(d).hashCode());
    }

    static void bytesKey(byte[] b) {
        key("bytes", "\"bytes\": " + Arrays.toString(b), Arrays.hashCode(b));
    }

    static void tupleKey(Integer f0, String f1) {
        String first = f0 == null ? "null" : "\"" + f0 + "\"";
        String second = f1 == null ? "null" : "{\"units\": " + units(f1) + "}";
        key("tuple2_int_string", "\"f0\": " + first + ", \"f1\": " + second, tuple2Hash(f0, f1));
    }

    static String join(List<String> items, String indent) {
        return "[\n" + indent + String.join(",\n" + indent, items) + "\n  ]";
    }

    public static void main(String[] args) {
        // ints (java.lang.Integer)
        for (int v : new int[] {0, 1, -1, 2, 3, 4, 5, 7, 42, 100, -100, 127, 128, 65535, 65536,
                                 123456789, -123456789, Integer.MAX_VALUE, Integer.MIN_VALUE,
                                 Integer.MAX_VALUE - 1, Integer.MIN_VALUE + 1,
                                 // found by inverting the arithmetic: murmurHash maps these to
                                 // 0 (through Integer.MIN_VALUE), 0 (through 0), 1, MAX_VALUE
                                 -2089875627, -1035494534, -714456186, 994512208}) {
            intKey(v);
        }
        // longs outside the int range (java.lang.Long): what a Python int there means
        for (long v : new long[] {1L << 31, -(1L << 31) - 1, 1L << 32, (1L << 32) + 1,
                                  -(1L << 32), 5_000_000_000L, -5_000_000_000L,
                                  1234567890123456789L, -1234567890123456789L,
                                  Long.MAX_VALUE, Long.MIN_VALUE, Long.MAX_VALUE - 1,
                                  Long.MIN_VALUE + 1, 0x7FFFFFFF00000000L, -4294967297L}) {
            longKey(v);
        }
        // strings (java.lang.String, UTF-16)
        for (String s : new String[] {"", "a", "b", "hello", "flink", "key-1", "key-2",
                                      "Hello, World!", "\u00e9", "caf\u00e9",
                                      "\u65e5\u672c\u8a9e", "\ud83d\ude00",
                                      "a\ud83d\ude00b", "\ud801\udc37\u00ff\u0000x",
                                      "\u0000", "\uffff", "\ud800\udc00",
                                      "\udbff\udfff", "polygenelubricants",
                                      "a somewhat longer key that wraps the 32-bit hash"}) {
            stringKey(s);
        }
        // booleans
        booleanKey(true);
        booleanKey(false);
        // doubles (java.lang.Double: the long hash of doubleToLongBits, NaN canonical)
        for (double d : new double[] {0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 3.141592653589793,
                                      1e300, -1e-300, Double.MIN_VALUE, Double.MAX_VALUE,
                                      Double.POSITIVE_INFINITY, Double.NEGATIVE_INFINITY,
                                      Double.NaN, Double.longBitsToDouble(0x7ff0000000000001L),
                                      Double.longBitsToDouble(0xfff8000000000000L),
                                      4294967296.0, 123456.789}) {
            doubleKey(d);
        }
        // byte arrays (java.util.Arrays.hashCode(byte[]): seed 1, signed bytes)
        bytesKey(new byte[] {});
        bytesKey(new byte[] {0});
        bytesKey(new byte[] {1, 2, 3});
        bytesKey(new byte[] {-1});
        bytesKey(new byte[] {-128, 127, 0, -1});
        bytesKey("hello".getBytes(java.nio.charset.StandardCharsets.UTF_8));
        byte[] ramp = new byte[64];
        for (int i = 0; i < ramp.length; i++) {
            ramp[i] = (byte) (i * 37);
        }
        bytesKey(ramp);
        // Flink Tuple2<Integer, String>: 31 * hash(f0) + hash(f1)
        tupleKey(1, "a");
        tupleKey(0, "");
        tupleKey(-1, "flink");
        tupleKey(42, "\u65e5\u672c\u8a9e");
        tupleKey(Integer.MAX_VALUE, "\ud83d\ude00");
        tupleKey(Integer.MIN_VALUE, "key-1");
        tupleKey(7, null);
        tupleKey(null, "b");
        tupleKey(null, null);

        // Long.hashCode of longs a Python int in the int range does not reach
        List<String> longHashes = new ArrayList<>();
        for (long v : new long[] {0L, 5L, -1L, -2L, 1L << 32, Long.MIN_VALUE, Long.MAX_VALUE,
                                  Integer.MIN_VALUE, Integer.MAX_VALUE}) {
            longHashes.add("{\"value\": \"" + v + "\", \"hash\": " + Long.hashCode(v) + "}");
        }

        // operator ranges
        List<String> ranges = new ArrayList<>();
        int[][] pairs = {{128, 3}, {128, 4}, {10, 3}, {32768, 7}, {7, 7}, {1, 1}, {128, 1},
                         {128, 128}, {100, 7}, {1000, 3}, {32768, 32768}, {32768, 32767},
                         {32768, 1}, {5, 2}};
        for (int[] pair : pairs) {
            int maxP = pair[0];
            int p = pair[1];
            List<Integer> indices = new ArrayList<>();
            if (p <= 16) {
                for (int i = 0; i < p; i++) {
                    indices.add(i);
                }
            } else {
                for (int i : new int[] {0, 1, 2, p / 2, p - 2, p - 1}) {
                    if (!indices.contains(i)) {
                        indices.add(i);
                    }
                }
            }
            List<String> items = new ArrayList<>();
            for (int i : indices) {
                int[] range = rangeForOperator(maxP, p, i);
                items.add("{\"index\": " + i + ", \"start\": " + range[0] + ", \"end\": "
                          + range[1] + ", \"start_operator\": "
                          + operatorForKeyGroup(maxP, p, range[0]) + ", \"end_operator\": "
                          + operatorForKeyGroup(maxP, p, range[1]) + "}");
            }
            String operators = "";
            if (maxP <= 128) {
                StringBuilder all = new StringBuilder(", \"operator_of_key_group\": [");
                for (int kg = 0; kg < maxP; kg++) {
                    if (kg > 0) {
                        all.append(", ");
                    }
                    all.append(operatorForKeyGroup(maxP, p, kg));
                }
                operators = all.append(']').toString();
            }
            ranges.add("{\"max_parallelism\": " + maxP + ", \"parallelism\": " + p
                       + ", \"ranges\": " + items + operators + "}");
        }

        // default max parallelism
        List<String> defaults = new ArrayList<>();
        for (int p : new int[] {1, 2, 3, 10, 85, 86, 100, 128, 171, 1000, 1365, 1366, 10000,
                                21845, 21846, 32767, 32768}) {
            defaults.add("{\"parallelism\": " + p + ", \"max_parallelism\": "
                         + defaultMaxParallelism(p) + "}");
        }

        System.out.println("{");
        System.out.println("  \"keys\": " + join(KEYS, "    ") + ",");
        System.out.println("  \"long_hashes\": " + join(longHashes, "    ") + ",");
        System.out.println("  \"operator_ranges\": " + join(ranges, "    ") + ",");
        System.out.println("  \"default_max_parallelism\": " + join(defaults, "    "));
        System.out.println("}");
    }
}
