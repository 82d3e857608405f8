// Unit tests of exclusions (JSON pointers) and of the interrupt probe:
//  - exclusion against a simple reference (remove the pointed-at values from a
//    tree, then canonicalize) on random documents and pointer sets, escapes,
//    duplicates, overlapping pointers, and 100,000 pointers finishing fast;
//  - a probe that fires stops every long computation with Interrupted, asked
//    regularly (every ~64 KiB of input, 1 MiB hashed, 4096 items), and a probe
//    that never fires changes nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fingerprint.hpp"
#include "jcs.hpp"

namespace {

using idem::core::canonicalize;
using idem::core::CanonicalizeOptions;
using idem::core::Interrupted;
using idem::core::JsonError;
using idem::core::JsonPointer;
using idem::core::PointerList;

// ---------------------------------------------------------------------------
// A small JSON tree for the reference.

struct Value {
    enum Kind { scalar, array, object } kind = scalar;
    std::string text;                                    // scalar: its JSON text
    std::vector<std::pair<std::string, Value>> members;  // object: unescaped name, value
    std::vector<Value> elements;                         // array
    bool removed = false;                                // excluded by the reference
};

std::string quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '/') {
            out += "\\/";  // an escape the canonical form drops
        } else {
            out += c;
        }
    }
    return out + "\"";
}

// The JSON text of v, leaving out removed values when `prune`.
std::string write(const Value& v, bool prune) {
    switch (v.kind) {
        case Value::scalar: return v.text;
        case Value::array: {
            std::string out = "[";
            bool first = true;
            for (const Value& e : v.elements) {
                if (prune && e.removed) continue;
                if (!first) out += ", ";
                first = false;
                out += write(e, prune);
            }
            return out + "]";
        }
        case Value::object: {
            std::string out = "{ ";
            bool first = true;
            for (const auto& [name, member] : v.members) {
                if (prune && member.removed) continue;
                if (!first) out += ",";
                first = false;
                out += quote(name) + ": " + write(member, prune);
            }
            return out + "}";
        }
    }
    return "";
}

// Names chosen to collide with pointer syntax and array indexes.
const std::vector<std::string> kNames = {"a",  "b",           "",     "~",     "/",  "~0",
                                         "~1", "a/b",         "0",    "1",     "01", "10",
                                         "-",  "caf\xC3\xA9", "a\nb", "\"q\"", "zz", "a~b"};

Value random_value(std::mt19937& rng, int depth) {
    Value v;
    const int kind = depth >= 4 ? 0 : static_cast<int>(rng() % 3);
    if (kind == 0) {
        static const char* scalars[] = {"1",    "2.50", "-0",    "1e2",
                                        "true", "null", "\"s\"", "\"\\u00e9\""};
        v.text = scalars[rng() % 8];
        return v;
    }
    if (kind == 1) {
        v.kind = Value::array;
        const std::size_t n = rng() % 13;
        for (std::size_t i = 0; i < n; ++i) v.elements.push_back(random_value(rng, depth + 1));
        return v;
    }
    v.kind = Value::object;
    std::vector<std::string> names = kNames;
    std::shuffle(names.begin(), names.end(), rng);
    const std::size_t n = rng() % 7;
    for (std::size_t i = 0; i < n; ++i)
        v.members.emplace_back(names[i], random_value(rng, depth + 1));
    return v;
}

// Marks what `tokens` names in v, as RFC 6901 resolves it against the input
// document (indexes count the original elements; nothing that is not there).
void remove(Value& v, const std::vector<std::string>& tokens, std::size_t depth = 0) {
    if (depth == tokens.size()) {
        v.removed = true;
        return;
    }
    const std::string& t = tokens[depth];
    if (v.kind == Value::object) {
        for (auto& [name, member] : v.members)
            if (name == t) remove(member, tokens, depth + 1);
    } else if (v.kind == Value::array) {
        if (t.empty() || t.size() > 9 || (t.size() > 1 && t[0] == '0')) return;
        for (char c : t)
            if (c < '0' || c > '9') return;
        const std::size_t index = std::stoul(t);
        if (index < v.elements.size()) remove(v.elements[index], tokens, depth + 1);
    }
}

std::string escape_token(const std::string& token) {
    std::string out;
    for (char c : token) {
        if (c == '~')
            out += "~0";
        else if (c == '/')
            out += "~1";
        else
            out += c;
    }
    return out;
}

// A pointer into v: mostly along existing paths (so that it matches), with
// random stops, and now and then a token that is not there.
std::vector<std::string> random_path(std::mt19937& rng, const Value& root) {
    std::vector<std::string> tokens;
    const Value* v = &root;
    for (;;) {
        if (rng() % 5 == 0) {  // a token that may match nothing
            static const char* noise[] = {"-", "01", "99", "nothing", "", "4294967295", "00"};
            tokens.push_back(noise[rng() % 7]);
        } else if (v->kind == Value::object && !v->members.empty()) {
            const auto& m = v->members[rng() % v->members.size()];
            tokens.push_back(m.first);
            v = &m.second;
        } else if (v->kind == Value::array && !v->elements.empty()) {
            const std::size_t i = rng() % v->elements.size();
            tokens.push_back(std::to_string(i));
            v = &v->elements[i];
        } else {
            tokens.push_back(kNames[rng() % kNames.size()]);
        }
        if (rng() % 3 == 0 || tokens.size() > 5) return tokens;
        if (tokens.size() > 0 && rng() % 9 == 0) return tokens;
    }
}

std::string canonical(const std::string& json, const std::vector<JsonPointer>* exclude = nullptr,
                      const CanonicalizeOptions& options = {}) {
    std::string out;
    JsonError error;
    EXPECT_TRUE(canonicalize(json, out, error, options, exclude))
        << error.message() << " in " << json;
    return out;
}

TEST(ExcludeReference, RandomDocumentsAndPointerSets) {
    std::mt19937 rng(20261130);
    int changed = 0;  // rounds in which something was excluded
    for (int round = 0; round < 3000; ++round) {
        Value doc = random_value(rng, 0);
        if (doc.kind == Value::scalar && round % 2 == 0) continue;
        const std::string text = write(doc, false);
        std::vector<JsonPointer> exclude;
        std::vector<std::string> texts;
        const std::size_t n = rng() % 9;
        for (std::size_t i = 0; i < n; ++i) {
            std::vector<std::string> tokens = random_path(rng, doc);
            std::string pointer;
            for (const auto& t : tokens) pointer += "/" + escape_token(t);
            exclude.push_back(JsonPointer::parse(pointer));
            texts.push_back(pointer);
            ASSERT_EQ(exclude.back().tokens(), tokens) << pointer;
            remove(doc, tokens);
            if (rng() % 4 == 0) {  // a duplicate
                exclude.push_back(exclude.back());
                texts.push_back(pointer);
            }
        }
        std::shuffle(exclude.begin(), exclude.end(), rng);
        // The whole document is never excluded (no pointer is empty).
        const std::string expected = canonical(write(doc, true));
        EXPECT_EQ(canonical(text, &exclude), expected) << text << "\nround " << round;
        // The same from the pointers' texts, through a PointerList.
        PointerList list;
        for (const auto& t : texts) list.add(t);
        std::string out;
        JsonError error;
        ASSERT_TRUE(canonicalize(text, out, error, {}, list));
        EXPECT_EQ(out, expected) << text << "\nround " << round;
        changed += expected != canonical(text);
    }
    EXPECT_GT(changed, 1000);  // the pointers mostly hit something
}

TEST(ExcludeReference, Escapes) {
    const std::string doc = R"({"~":1,"/":2,"~1":3,"~0":4,"a/b":5,"a~b":6,"x":{"~/":7,"k":8}})";
    auto without = [&](std::vector<std::string> pointers) {
        std::vector<JsonPointer> exclude;
        for (const auto& p : pointers) exclude.push_back(JsonPointer::parse(p));
        return canonical(doc, &exclude);
    };
    EXPECT_EQ(without({"/~0"}), R"({"/":2,"a/b":5,"a~b":6,"x":{"k":8,"~/":7},"~0":4,"~1":3})");
    EXPECT_EQ(without({"/~1"}), R"({"a/b":5,"a~b":6,"x":{"k":8,"~/":7},"~":1,"~0":4,"~1":3})");
    EXPECT_EQ(without({"/~01"}), R"({"/":2,"a/b":5,"a~b":6,"x":{"k":8,"~/":7},"~":1,"~0":4})");
    EXPECT_EQ(without({"/~00"}), R"({"/":2,"a/b":5,"a~b":6,"x":{"k":8,"~/":7},"~":1,"~1":3})");
    EXPECT_EQ(without({"/a~1b", "/a~0b"}), R"({"/":2,"x":{"k":8,"~/":7},"~":1,"~0":4,"~1":3})");
    EXPECT_EQ(without({"/x/~0~1"}), R"({"/":2,"a/b":5,"a~b":6,"x":{"k":8},"~":1,"~0":4,"~1":3})");
    EXPECT_EQ(without({"/a/b"}), canonical(doc));  // not the member "a/b"
}

TEST(ExcludeReference, PointerListParsesLikeJsonPointer) {
    PointerList list;
    for (const char* text : {"/a~1b/~0/", "/", "/~01/0", "/a//b"}) {
        list.add(text);
        const JsonPointer pointer = JsonPointer::parse(text);
        const std::size_t i = list.size() - 1;
        ASSERT_EQ(list.token_count(i), pointer.tokens().size()) << text;
        for (std::size_t j = 0; j < pointer.tokens().size(); ++j)
            EXPECT_EQ(list.token(i, j), pointer.tokens()[j]);
    }
    for (const char* bad : {"", "a", "/a~2", "/a~", "/~"}) {
        EXPECT_THROW(list.add(bad), std::invalid_argument) << bad;
        EXPECT_THROW(JsonPointer::parse(bad), std::invalid_argument) << bad;
    }
    EXPECT_EQ(list.size(), 4u);  // a rejected pointer leaves nothing behind
    EXPECT_EQ(list.token(3, 2), "b");
    list.add(JsonPointer());  // no token: excludes nothing
    std::string out;
    JsonError error;
    ASSERT_TRUE(canonicalize(R"({"a/b":{"~":{"":1,"x":2}},"~1":[3,4],"a":{"":{"b":5}},"":6})", out,
                             error, {}, list));
    EXPECT_EQ(out, R"({"a":{"":{}},"a/b":{"~":{"x":2}},"~1":[4]})");  // "/" is the member ""
}

TEST(ExcludeReference, DuplicatesAndOverlaps) {
    const std::string doc = R"({"a":{"b":{"c":1,"d":2},"e":[10,11,{"f":12}]},"g":3})";
    auto without = [&](std::vector<std::string> pointers) {
        std::vector<JsonPointer> exclude;
        for (const auto& p : pointers) exclude.push_back(JsonPointer::parse(p));
        return canonical(doc, &exclude);
    };
    EXPECT_EQ(without({"/a/b", "/a/b", "/a/b"}), R"({"a":{"e":[10,11,{"f":12}]},"g":3})");
    EXPECT_EQ(without({"/a/b/c", "/a/b", "/a/b/c/x"}), R"({"a":{"e":[10,11,{"f":12}]},"g":3})");
    EXPECT_EQ(without({"/a", "/a/b/c", "/a/e/2/f"}), R"({"g":3})");
    EXPECT_EQ(without({"/a/e/2/f", "/a/e/0", "/a/e/2/f", "/a/e/1"}),
              R"({"a":{"b":{"c":1,"d":2},"e":[{}]},"g":3})");
    EXPECT_EQ(without({"/a/e/02", "/a/e/-", "/a/e/3", "/a/e/2/f/0"}), canonical(doc));
}

TEST(ExcludeScale, HundredThousandPointersFlatAndDeep) {
    std::string doc = "[";
    std::vector<JsonPointer> exclude;
    for (int i = 0; i < 100000; ++i) {
        if (i) doc += ',';
        doc += std::to_string(i);
        exclude.push_back(JsonPointer::parse("/" + std::to_string(99999 - i)));  // in reverse
    }
    doc += "]";
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(canonical(doc, &exclude), "[]");
    // Deep pointers that share a long prefix: the sort compares one token at a time.
    std::string deep, prefix;
    for (int i = 0; i < 100; ++i) {
        deep += "{\"a\":";
        prefix += "/a";
    }
    deep += doc;
    for (int i = 0; i < 100; ++i) deep += "}";
    std::vector<JsonPointer> deep_exclude;
    for (int i = 0; i < 100000; i += 2)
        deep_exclude.push_back(JsonPointer::parse(prefix + "/" + std::to_string(i)));
    const std::string out = canonical(deep, &deep_exclude);
    EXPECT_EQ(out.substr(0, 5 * 100 + 5), deep.substr(0, 5 * 100) + "[1,3,");
    EXPECT_EQ(out.substr(out.size() - 113, 13), ",99997,99999]");
    // No timing is asserted (tests never do): quadratic exclusion took about a
    // minute for the first half alone, which the suite's run time would show;
    // the speed itself is measured by tests/integration/cancel_long_calls.sh's
    // uncanceled run and recorded in docs/benchmarks.md.
    std::printf("100,000 exclusions, flat and 100 levels deep: %.2f s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// ---------------------------------------------------------------------------
// The interrupt probe.

// Test probe: counts its calls and fires at call number fire_at (0: never).
std::size_t probe_calls = 0;
std::size_t fire_at = 0;
bool test_probe() noexcept { return ++probe_calls == fire_at; }

CanonicalizeOptions probed(std::size_t fire) {
    probe_calls = 0;
    fire_at = fire;
    CanonicalizeOptions options;
    options.interrupt = test_probe;
    return options;
}

// Long inputs, one for each kind of loop that must ask the probe.
struct LongInput {
    const char* name;
    std::string json;
    std::vector<JsonPointer> exclude;
};

std::vector<LongInput> long_inputs() {
    std::vector<LongInput> inputs;
    const std::size_t big = std::size_t{8} << 20;  // 8 MiB
    {
        std::string s = "[";
        while (s.size() < big) s += "{\"b\":1.50,\"a\":[1e2,true,\"x\\n\"]},";
        s += "0]";
        inputs.push_back({"many small values", s, {}});
    }
    inputs.push_back({"one long plain string", "[\"" + std::string(big, 'x') + "\"]", {}});
    {
        std::string s = "\"";
        while (s.size() < big) s += "\\n\xC3\xA9x";
        inputs.push_back({"one long escaped string", s + "\"", {}});
    }
    {
        std::string s = "{\"";
        while (s.size() < big) s += "\\n\xC3\xA9x";
        inputs.push_back({"one long escaped member name", s + "\":1}", {}});
    }
    {
        std::string s = "{";
        for (int i = 400000; i > 0; --i)
            s += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
        s += "\"z\":0}";
        inputs.push_back({"one object with 400,000 members", s, {}});
    }
    {
        // Each of 900 nested objects moves the big member behind its "a" member:
        // the copies add up to 900 times the document.
        std::string s;
        for (int i = 0; i < 900; ++i) s += "{\"b\":";
        s += "\"" + std::string(std::size_t{1} << 16, 'y') + "\"";
        for (int i = 0; i < 900; ++i) s += ",\"a\":1}";
        inputs.push_back({"deep reordering copies", s, {}});
    }
    {
        std::string s = "[";
        LongInput input{"100,000 exclusion pointers", "", {}};
        for (int i = 0; i < 100000; ++i) {
            s += std::to_string(i) + ",";
            input.exclude.push_back(JsonPointer::parse("/" + std::to_string(i * 7 % 100000)));
        }
        input.json = s + "0]";
        inputs.push_back(std::move(input));
    }
    inputs.push_back({"a number of 300,000 digits", "[0." + std::string(300000, '0') + "1]", {}});
    return inputs;
}

TEST(InterruptProbe, NeverFiringChangesNothingAndIsAskedRegularly) {
    for (const LongInput& input : long_inputs()) {
        const std::string expected = canonical(input.json, &input.exclude);
        EXPECT_EQ(canonical(input.json, &input.exclude, probed(0)), expected) << input.name;
        // At least once per 1 MiB of input (the pass asks every 64 KiB).
        EXPECT_GE(probe_calls, input.json.size() >> 20) << input.name;
        EXPECT_GE(probe_calls, 1u) << input.name;
    }
}

TEST(InterruptProbe, FiringStopsEachLongComputation) {
    for (const LongInput& input : long_inputs()) {
        canonical(input.json, &input.exclude, probed(0));
        const std::size_t calls = probe_calls;  // when it never fires
        for (std::size_t fire : {std::size_t{1}, calls / 2 + 1, calls}) {
            std::string out;
            JsonError error;
            const CanonicalizeOptions options = probed(fire);
            EXPECT_THROW(canonicalize(input.json, out, error, options, &input.exclude), Interrupted)
                << input.name << ", firing at call " << fire;
            EXPECT_EQ(probe_calls, fire) << input.name;  // stopped at once
        }
        // The thread's scratch buffers are usable again.
        EXPECT_EQ(canonical("{\"b\":1,\"a\":[2]}"), "{\"a\":[2],\"b\":1}");
    }
}

TEST(InterruptProbe, SmallDocumentsAreNeverAsked) {
    const std::string doc(60000, ' ');
    EXPECT_EQ(canonical(doc + "[1]", nullptr, probed(1)), "[1]");
    EXPECT_EQ(probe_calls, 0u);
}

TEST(InterruptProbe, ManyPointersOnASmallDocument) {
    std::vector<JsonPointer> exclude;
    for (int i = 0; i < 50000; ++i)
        exclude.push_back(JsonPointer::parse("/a/" + std::to_string(i)));
    EXPECT_EQ(canonical("{\"a\":[1,2],\"b\":3}", &exclude, probed(0)), "{\"a\":[],\"b\":3}");
    EXPECT_GE(probe_calls, 50000u / idem::core::kPollItems);
    std::string out;
    JsonError error;
    EXPECT_THROW(canonicalize("{\"a\":[1,2]}", out, error, probed(3), &exclude), Interrupted);
}

TEST(InterruptProbe, FingerprintHashesLargeBodiesInChunks) {
    const std::string body(std::size_t{64} << 20, 'x');  // not JSON: hashed raw
    CanonicalizeOptions options = probed(0);
    const auto digest = idem::core::fingerprint("POST", "/p", std::string_view(body), {}, options);
    EXPECT_EQ(digest, idem::core::sha256("POST\n/p\n" + body));
    EXPECT_GE(probe_calls, 63u);  // once per MiB
    options = probed(10);
    EXPECT_THROW(idem::core::fingerprint("POST", "/p", std::string_view(body), {}, options),
                 Interrupted);
    EXPECT_EQ(probe_calls, 10u);

    probe_calls = 0;
    fire_at = 0;
    EXPECT_EQ(idem::core::sha256(body, test_probe), idem::core::sha256(body));
    EXPECT_GE(probe_calls, 63u);
    fire_at = probe_calls / 2;
    probe_calls = 0;
    EXPECT_THROW(idem::core::sha256(body, test_probe), Interrupted);

    // A long JSON body: asked while canonicalizing and while hashing.
    std::string json = "[";
    while (json.size() < (std::size_t{4} << 20)) json += "\"abcdefghijklmnopqrstuvwxyz\",";
    json += "0]";
    options = probed(0);
    EXPECT_EQ(idem::core::fingerprint("POST", "/p", std::string_view(json), {}, options),
              idem::core::fingerprint("POST", "/p", std::string_view(json)));
    EXPECT_GE(probe_calls, 4u + 3u);
    // A long method (a valid token) and path.
    const std::string method(std::size_t{4} << 20, 'g');
    options = probed(0);
    EXPECT_EQ(idem::core::fingerprint(method, "/p", std::nullopt, {}, options),
              idem::core::fingerprint(method, "/p", std::nullopt));
    EXPECT_GE(probe_calls, 4u);
}

}  // namespace
