// Throughput of idem::core::canonicalize on the benchmark corpora.
//
//   jcs_bench [--seconds S] [--min-runs N] [--emit DIR] CORPUS.jsonl...
//
// A corpus holds one JSON document per line (see gen_corpus.js). One run
// canonicalizes every document of the corpus once, into a reused output string;
// runs repeat until S seconds (default 1.5) have passed and at least N runs
// (default 5) were made, after one untimed warm-up run. Throughput counts input
// bytes (the documents without their newlines), in MB/s with MB = 10^6 bytes.
//
// Prints one JSON object per corpus on stdout:
//   {"impl":"ours","corpus":"api-1k","docs":4026,"bytes":4194497,"runs":123,
//    "median_mbps":...,"min_mbps":...,"max_mbps":...}
// With --emit DIR, also writes DIR/<corpus>.canon: the canonical form of each
// document, one per line, which node_bench.js compares with the npm packages.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "jcs.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        std::cerr << "jcs_bench: cannot read " << path << "\n";
        std::exit(2);
    }
    std::ostringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
}

std::string corpus_name(const std::string& path) {
    std::string base = path.substr(path.find_last_of('/') + 1);
    auto dot = base.find('.');
    return dot == std::string::npos ? base : base.substr(0, dot);
}

// Keeps the compiler from dropping work whose result is otherwise unused.
volatile std::size_t g_sink;

}  // namespace

int main(int argc, char** argv) {
    double seconds = 1.5;
    int min_runs = 5;
    std::string emit_dir;
    std::vector<std::string> files;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--seconds" && i + 1 < argc) {
            seconds = std::atof(argv[++i]);
        } else if (arg == "--min-runs" && i + 1 < argc) {
            min_runs = std::atoi(argv[++i]);
        } else if (arg == "--emit" && i + 1 < argc) {
            emit_dir = argv[++i];
        } else if (!arg.empty() && arg[0] == '-') {
            std::cerr
                << "usage: jcs_bench [--seconds S] [--min-runs N] [--emit DIR] CORPUS.jsonl...\n";
            return 2;
        } else {
            files.push_back(arg);
        }
    }
    if (files.empty()) {
        std::cerr << "usage: jcs_bench [--seconds S] [--min-runs N] [--emit DIR] CORPUS.jsonl...\n";
        return 2;
    }

    for (const std::string& file : files) {
        const std::string data = read_file(file);
        std::vector<std::string_view> docs;
        std::size_t bytes = 0;
        for (std::size_t pos = 0; pos < data.size();) {
            std::size_t nl = data.find('\n', pos);
            if (nl == std::string::npos) nl = data.size();
            if (nl > pos) {
                docs.emplace_back(data.data() + pos, nl - pos);
                bytes += nl - pos;
            }
            pos = nl + 1;
        }
        const std::string name = corpus_name(file);

        // Warm-up run, which also checks that every document is accepted.
        std::string out;
        idem::core::JsonError error;
        std::string emitted;
        for (std::size_t d = 0; d < docs.size(); ++d) {
            if (!idem::core::canonicalize(docs[d], out, error)) {
                std::cerr << "jcs_bench: " << file << ": document " << d + 1 << ": "
                          << error.message() << "\n";
                return 1;
            }
            if (!emit_dir.empty()) {
                emitted += out;
                emitted += '\n';
            }
        }
        if (!emit_dir.empty()) {
            std::ofstream canon(emit_dir + "/" + name + ".canon", std::ios::binary);
            canon << emitted;
            if (!canon) {
                std::cerr << "jcs_bench: cannot write " << emit_dir << "/" << name << ".canon\n";
                return 2;
            }
        }

        std::vector<double> mbps;
        const auto budget_end = Clock::now() + std::chrono::duration<double>(seconds);
        while (static_cast<int>(mbps.size()) < min_runs || Clock::now() < budget_end) {
            std::size_t total = 0;
            const auto t0 = Clock::now();
            for (std::string_view doc : docs) {
                idem::core::canonicalize(doc, out, error);
                total += out.size();
            }
            const auto t1 = Clock::now();
            g_sink = total;
            const double s = std::chrono::duration<double>(t1 - t0).count();
            mbps.push_back(static_cast<double>(bytes) / s / 1e6);
        }
        std::sort(mbps.begin(), mbps.end());
        const std::size_t n = mbps.size();
        const double median = n % 2 ? mbps[n / 2] : (mbps[n / 2 - 1] + mbps[n / 2]) / 2;
        std::printf(
            "{\"impl\":\"ours\",\"corpus\":\"%s\",\"docs\":%zu,\"bytes\":%zu,\"runs\":%zu,"
            "\"median_mbps\":%.1f,\"min_mbps\":%.1f,\"max_mbps\":%.1f}\n",
            name.c_str(), docs.size(), bytes, n, median, mbps.front(), mbps.back());
        std::fflush(stdout);
    }
    return 0;
}
