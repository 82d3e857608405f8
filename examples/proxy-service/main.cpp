// proxy-service: forwards POST /v1/call/<path> to an upstream HTTP service at
// most once per Idempotency-Key, under a lease that a background thread renews
// while the upstream call runs, and replays the upstream's response to retries.
//
//   proxy-service --port 8090 --dsn "..." [--lease-ms 1000] [--threads 8]
//
// For a self-contained demo it also starts a small "upstream" (a payment
// provider stand-in) on port+1:
//   POST /charge[?delay_ms=N]  -> 201 {"charge_id": n, "amount": ...}   (slow on request)
//   GET  /calls                -> {"calls": n}: how often it was really called
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "flags.hpp"
#include "httplib_response.hpp"
#include <idem/lease.hpp>

namespace {

std::string dsn;
int upstream_port = 0;
std::chrono::milliseconds lease{1000};
std::atomic<long> upstream_calls{0};

idem::LeaseRunner& runner() {
    thread_local std::unique_ptr<idem::LeaseRunner> instance;
    if (!instance) {
        idem::LeaseOptions options;
        options.policy = idem::Policy::remember;
        options.lease = lease;
        instance = std::make_unique<idem::LeaseRunner>(dsn, options);
    }
    return *instance;
}

using examples::send;

// The external effect: one HTTP call upstream. Never cancelled once started.
idem::Response call_upstream(const std::string& path, const std::string& query,
                             const std::string& body) {
    httplib::Client upstream("127.0.0.1", upstream_port);
    upstream.set_read_timeout(60, 0);
    auto result = upstream.Post((path + query).c_str(), body, "application/json");
    idem::Response response;
    if (!result) {
        response.status = 502;  // not final: the key is released, a retry calls again
        response.body = R"({"error":"upstream unreachable"})";
        response.headers = {{"Content-Type", "application/json"}};
        return response;
    }
    response.status = result->status;
    response.body = result->body;
    response.headers = {{"Content-Type", result->get_header_value("Content-Type")}};
    return response;
}

void proxy(const httplib::Request& in, httplib::Response& out) {
    const std::string auth = in.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) != 0 || auth.size() <= 7) {
        out.status = 401;
        out.set_content(R"({"title":"Unauthorized"})", "application/problem+json");
        return;
    }
    idem::Request request;
    request.principal = auth.substr(7);
    if (in.has_header("Idempotency-Key")) request.key = in.get_header_value("Idempotency-Key");
    request.method = in.method;
    request.path = in.path;
    request.body = in.body;
    const std::string upstream_path = "/" + in.matches[1].str();
    std::string query;
    if (in.has_param("delay_ms")) query = "?delay_ms=" + in.get_param_value("delay_ms");
    try {
        idem::LeaseResult result =
            runner().run(request, [&] { return call_upstream(upstream_path, query, in.body); });
        send(out, result.response);
        out.set_header("X-Lease-Outcome", idem::to_string(result.outcome));
        out.set_header("X-Lease-Renewals", std::to_string(result.renewals));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "proxy-service: %s\n", e.what());
        if (idem::is_database_fault(e)) {  // a retry with the same key is safe: 503
            send(out, idem::database_fault_response(1, "/problems/"));
            return;
        }
        out.status = 500;
        out.set_content(R"({"title":"Internal error"})", "application/problem+json");
    }
}

}  // namespace

int main(int argc, char** argv) {
    int port = 8090;
    int threads = 8;
    int lease_ms = static_cast<int>(lease.count());
    if (!examples::Flags("proxy-service [--port N] [--dsn CONNINFO] [--lease-ms N] [--threads N]")
             .number("--port", &port)
             .text("--dsn", &dsn)
             .number("--lease-ms", &lease_ms)
             .number("--threads", &threads)
             .parse(argc, argv))
        return 2;
    lease = std::chrono::milliseconds(lease_ms);
    upstream_port = port + 1;

    httplib::Server upstream;
    upstream.Post("/charge", [](const httplib::Request& in, httplib::Response& out) {
        const long call = ++upstream_calls;
        if (in.has_param("delay_ms"))
            std::this_thread::sleep_for(
                std::chrono::milliseconds(std::atoi(in.get_param_value("delay_ms").c_str())));
        nlohmann::json body = nlohmann::json::parse(in.body, nullptr, false);
        nlohmann::json charge = {{"charge_id", "ch_" + std::to_string(call)},
                                 {"amount", body.is_object() ? body.value("amount", 0) : 0}};
        out.status = 201;
        out.set_content(charge.dump(), "application/json");
    });
    upstream.Get("/calls", [](const httplib::Request&, httplib::Response& out) {
        out.set_content(nlohmann::json{{"calls", upstream_calls.load()}}.dump(),
                        "application/json");
    });
    std::thread upstream_thread([&] { upstream.listen("127.0.0.1", upstream_port); });

    httplib::Server server;
    server.new_task_queue = [threads] {
        return new httplib::ThreadPool(static_cast<size_t>(threads));
    };
    // Small responses must not wait for delayed ACKs (Nagle), and keep-alive
    // connections should not be closed every few requests.
    server.set_tcp_nodelay(true);
    server.set_keep_alive_max_count(1000);
    server.Post(R"(/v1/call/(.+))", proxy);
    server.Get("/health", [](const httplib::Request&, httplib::Response& out) {
        out.set_content("ok", "text/plain");
    });
    std::fprintf(stderr,
                 "proxy-service: listening on 127.0.0.1:%d, upstream on %d, lease %lld ms\n", port,
                 upstream_port, static_cast<long long>(lease.count()));
    const bool ok = server.listen("127.0.0.1", port);
    upstream.stop();
    upstream_thread.join();
    return ok ? 0 : 1;
}
