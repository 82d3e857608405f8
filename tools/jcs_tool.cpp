// Command-line front end to the core, used by the differential tests and by hand.
//
//   jcs_tool canon            stdin -> canonical JSON on stdout (exit 1 on bad input)
//   jcs_tool check-numbers    stdin lines "HEX,EXPECTED" (64-bit pattern of a double
//                             and its ECMAScript text); compares format_number
//   jcs_tool check-documents  stdin records "<in_len> <out_len>\n<in><out>\n", where
//                             out is the reference canonical form; compares canonicalize
//   jcs_tool fingerprints     stdin records "<method_len> <path_len>
//   <body_len>\n<method><path><body>\n"
//                             (body_len -1: no body); prints one line per record: the
//                             request fingerprint in hex, or "error: <message>"
//
// The check modes print "N passed, N failed" and exit non-zero on any mismatch
// or when no record was read (a generator that died must not look like a pass).
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>

#include "fingerprint.hpp"
#include "jcs.hpp"

namespace {

std::string read_all(std::istream& in) {
    std::ostringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
}

int report(std::size_t passed, std::size_t failed) {
    std::printf("%zu passed, %zu failed\n", passed, failed);
    return (failed == 0 && passed > 0) ? 0 : 1;
}

int canon() {
    std::string input = read_all(std::cin);
    std::string out;
    idem::core::JsonError error;
    if (!idem::core::canonicalize(input, out, error)) {
        std::fprintf(stderr, "jcs_tool: %s\n", error.message().c_str());
        return 1;
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
}

int check_numbers() {
    std::size_t passed = 0, failed = 0;
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.empty()) continue;
        auto comma = line.find(',');
        if (comma == std::string::npos) {
            std::fprintf(stderr, "malformed line: %s\n", line.c_str());
            ++failed;
            continue;
        }
        std::uint64_t bits = std::stoull(line.substr(0, comma), nullptr, 16);
        double value;
        std::memcpy(&value, &bits, sizeof value);
        std::string expected = line.substr(comma + 1);
        std::string got = idem::core::format_number(value);
        if (got == expected) {
            ++passed;
        } else if (failed++ < 20) {
            std::fprintf(stderr, "mismatch for %s: expected %s, got %s\n",
                         line.substr(0, comma).c_str(), expected.c_str(), got.c_str());
        }
    }
    return report(passed, failed);
}

int check_documents() {
    std::string data = read_all(std::cin);
    std::size_t pos = 0, passed = 0, failed = 0, record = 0;
    std::string out;
    while (pos < data.size()) {
        std::size_t newline = data.find('\n', pos);
        std::size_t in_len = 0, out_len = 0;
        bool header_ok = false;
        if (newline != std::string::npos) {
            // from_chars, not sscanf: sscanf measures the whole remaining buffer per call.
            const char* first = data.data() + pos;
            const char* last = data.data() + newline;
            auto a = std::from_chars(first, last, in_len);
            if (a.ec == std::errc() && a.ptr < last && *a.ptr == ' ') {
                auto b = std::from_chars(a.ptr + 1, last, out_len);
                header_ok = b.ec == std::errc() && b.ptr == last;
            }
        }
        if (!header_ok || newline + 1 + in_len + out_len + 1 > data.size()) {
            std::fprintf(stderr, "malformed record header at byte %zu\n", pos);
            return report(passed, failed + 1);
        }
        std::string_view input(data.data() + newline + 1, in_len);
        std::string_view expected(data.data() + newline + 1 + in_len, out_len);
        pos = newline + 1 + in_len + out_len + 1;
        idem::core::JsonError error;
        bool ok = idem::core::canonicalize(input, out, error);
        if (ok && out == expected) {
            ++passed;
        } else if (failed++ < 10) {
            std::fprintf(stderr,
                         "record %zu: %s\n  input:    %.*s\n  expected: %.*s\n  got:      %s\n",
                         record, ok ? "output differs" : error.message().c_str(),
                         static_cast<int>(std::min<std::size_t>(input.size(), 400)), input.data(),
                         static_cast<int>(std::min<std::size_t>(expected.size(), 400)),
                         expected.data(), ok ? out.substr(0, 400).c_str() : "(error)");
        }
        ++record;
    }
    return report(passed, failed);
}

int fingerprints() {
    std::string data = read_all(std::cin);
    std::size_t pos = 0, records = 0;
    while (pos < data.size()) {
        std::size_t newline = data.find('\n', pos);
        long long lengths[3] = {0, 0, 0};
        bool header_ok = newline != std::string::npos;
        const char* cursor = data.data() + pos;
        const char* last = header_ok ? data.data() + newline : cursor;
        for (int i = 0; header_ok && i < 3; ++i) {
            auto parsed = std::from_chars(cursor, last, lengths[i]);
            const bool separated =
                i == 2 ? parsed.ptr == last : parsed.ptr < last && *parsed.ptr == ' ';
            header_ok = parsed.ec == std::errc() && separated;
            cursor = parsed.ptr + 1;
        }
        header_ok = header_ok && lengths[0] >= 0 && lengths[1] >= 0 && lengths[2] >= -1;
        const std::size_t body_len = lengths[2] < 0 ? 0 : static_cast<std::size_t>(lengths[2]);
        const std::size_t total =
            static_cast<std::size_t>(lengths[0]) + static_cast<std::size_t>(lengths[1]) + body_len;
        if (!header_ok || newline + 1 + total + 1 > data.size()) {
            std::fprintf(stderr, "malformed record header at byte %zu\n", pos);
            return 1;
        }
        const char* start = data.data() + newline + 1;
        std::string_view method(start, static_cast<std::size_t>(lengths[0]));
        std::string_view path(start + lengths[0], static_cast<std::size_t>(lengths[1]));
        std::optional<std::string_view> body;
        if (lengths[2] >= 0) body = std::string_view(start + lengths[0] + lengths[1], body_len);
        pos = newline + 1 + total + 1;
        try {
            std::printf("%s\n",
                        idem::core::to_hex(idem::core::fingerprint(method, path, body)).c_str());
        } catch (const std::exception& e) {
            std::printf("error: %s\n", e.what());
        }
        ++records;
    }
    return records > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    std::ios::sync_with_stdio(false);
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "canon") return canon();
    if (mode == "check-numbers") return check_numbers();
    if (mode == "check-documents") return check_documents();
    if (mode == "fingerprints") return fingerprints();
    std::fprintf(stderr,
                 "usage: jcs_tool canon | check-numbers | check-documents | fingerprints\n");
    return 2;
}
