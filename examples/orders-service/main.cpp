// orders-service: a small HTTP API whose POST /orders is idempotent through
// pg_idempotency's client library.
//
//   orders-service --port 8080 --dsn "host=... dbname=..."
//
//   POST /orders          body {"item": "...", "quantity": n}; needs an
//                         Idempotency-Key; Authorization: Bearer <principal>.
//                         ?delay_ms=N makes the handler take N ms longer (to
//                         show concurrent retries).
//   POST /reject/orders   the same in reject mode: a duplicate of a running request
//                         gets 409 with Retry-After at once instead of waiting
//   POST /plain/orders    the same handler without the idempotency wrapper
//                         (for the benchmark that measures the wrapper's cost)
//   POST /classic/orders  the same wrapped handler taking pqxx::work& (five
//                         round trips instead of three; for the benchmark)
//   POST /flaky/orders    the same, but the first run of the handler for each
//                         (principal, key) inserts the order and then answers 500:
//                         rolled back, not stored, the retry runs again
//   POST /orders/stream   body {"chunks": n, "chunk_bytes": m}: inserts one order and
//                         answers 200 text/plain streamed as n chunks of m bytes (chunk i
//                         is the digit i % 10); kept up to 65536 bytes, a longer stream
//                         is sent once and a retry gets 409 response-not-kept
//   POST /api-keys        body {"name": "..."}; creates an API key and answers
//                         its secret once (one_time_secret): a retry gets 409
//   GET  /orders/count    {"orders": n}
//   GET  /health          "ok"
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "flags.hpp"
#include "httplib_response.hpp"
#include <idem/client.hpp>
#include "pqxx_compat.hpp"  // one spelling of parameterized statements for libpqxx 6, 7 and 8

namespace {

std::string dsn;

// Counts lost connections: a worker connected before the last one is replaced before its next
// request (a restart ended every connection, not only the one that saw it).
std::atomic<long> lost_connections{0};

// libpqxx connections are not thread-safe: one connection and one client per
// worker thread of the HTTP server. An idem::Connection lets the client send
// BEGIN with idempotency.begin() and idempotency.complete() with COMMIT.
struct Worker {
    long generation = lost_connections.load();
    idem::Connection connection{dsn};
    idem::Client client{connection, options()};

    // The service connects to PostgreSQL directly, so the protocol's statements
    // can be prepared once per connection (not behind pgbouncer in transaction mode).
    static idem::Options options() {
        idem::Options o;
        o.prepare_statements = true;
        o.max_stream_bytes = 65536;  // POST /orders/stream: longer streams are not kept
        return o;
    }
};

using examples::send;

idem::Response problem(int status, const std::string& title, const std::string& detail) {
    idem::Response response;
    response.status = status;
    response.body = nlohmann::json{
        {"type", "about:blank"},
        {"title", title},
        {"status", status},
        {"detail",
         detail}}.dump();
    response.headers = {{"Content-Type", "application/problem+json"}};
    return response;
}

// This thread's worker; connects (again) when it has none or its connection is closed.
std::unique_ptr<Worker>& worker_slot() {
    thread_local std::unique_ptr<Worker> instance;
    return instance;
}

Worker& worker() {
    std::unique_ptr<Worker>& instance = worker_slot();
    if (!instance || !instance->connection.connection().is_open() ||
        instance->generation != lost_connections.load())
        instance = std::make_unique<Worker>();
    return *instance;
}

// The answer to an exception of the database: a database fault (idem::is_database_fault:
// a lost or refused connection, a shutdown, a cancel, an in-doubt commit) gets the one fault
// answer, 503 with Retry-After, and the thread's connection is dropped (the next request
// connects afresh); anything else is a 500 that does not show the driver's text.
idem::Response failed(const std::exception& e) {
    std::fprintf(stderr, "orders-service: %s\n", e.what());
    if (idem::is_database_fault(e)) {
        std::unique_ptr<Worker>& slot = worker_slot();
        // A lost connection (not a cancel): the other workers' may be lost as well.
        if (!slot || !slot->connection.connection().is_open()) lost_connections.fetch_add(1);
        slot.reset();
        return idem::database_fault_response(1, "/problems/");
    }
    return problem(500, "Internal error",
                   "The request failed; it is safe to retry with the same key.");
}

// The application's handler: validate, insert the order, answer 201. It takes
// any libpqxx transaction, which lets the client pipeline its statements.
idem::TransactionHandler create_order(const std::string& principal, const std::string& body,
                                      int delay_ms) {
    return [principal, body, delay_ms](pqxx::transaction_base& tx) -> idem::Response {
        nlohmann::json input = nlohmann::json::parse(body, nullptr, false);
        if (input.is_discarded() || !input.is_object() || !input.contains("item") ||
            !input["item"].is_string() || input["item"].get<std::string>().empty())
            return problem(400, "Invalid order",
                           "The body must be a JSON object with a non-empty \"item\" string.");
        const int quantity = input.value("quantity", 1);
        if (quantity < 1 || quantity > 1000)
            return problem(422, "Invalid quantity", "quantity must be 1 to 1000.");
        if (delay_ms > 0) idem::pq::exec(tx, "SELECT pg_sleep($1::float8 / 1000)", delay_ms);
        pqxx::row row = idem::pq::exec1(tx,
                                        "INSERT INTO orders (principal, item, quantity) VALUES "
                                        "($1, $2, $3) RETURNING id, created_at::text",
                                        principal, input["item"].get<std::string>(), quantity);
        const long id = row[0].as<long>();
        idem::Response response;
        response.status = 201;
        response.body = nlohmann::json{{"id", id},
                                       {"item", input["item"]},
                                       {"quantity", quantity},
                                       {"created_at", row[1].as<std::string>()}}
                            .dump();
        response.headers = {{"Content-Type", "application/json"},
                            {"Location", "/orders/" + std::to_string(id)}};
        response.resource_id = std::to_string(id);
        return response;
    };
}

// POST /orders/stream: validate, insert one order, then answer 200 text/plain streamed
// as n chunks of m bytes, chunk i made of the digit i % 10, each flushed on its own.
idem::TransactionHandler create_stream(const std::string& principal, const std::string& body) {
    return [principal, body](pqxx::transaction_base& tx) -> idem::Response {
        nlohmann::json input = nlohmann::json::parse(body, nullptr, false);
        // An integral number (5 or 5.0: the same request to the fingerprint) in 1..most.
        const auto count = [&input](const char* name, int most) {
            if (!input.is_object() || !input.contains(name) || !input[name].is_number()) return 0;
            const double value = input[name].get<double>();
            return value >= 1 && value <= most && value == std::floor(value)
                       ? static_cast<int>(value)
                       : 0;
        };
        const int chunks = count("chunks", 1000), chunk_bytes = count("chunk_bytes", 65536);
        if (chunks == 0 || chunk_bytes == 0)
            return idem::problem_response(idem::Problem::body_invalid,
                                          "The body must be a JSON object with \"chunks\" (1 to "
                                          "1000) and \"chunk_bytes\" (1 to 65536).",
                                          "/problems/");
        idem::pq::exec(tx,
                       "INSERT INTO orders (principal, item, quantity) VALUES ($1, 'stream', 1)",
                       principal);
        idem::Response response;
        response.status = 200;
        response.headers = {{"Content-Type", "text/plain"}};
        response.stream = [chunks, chunk_bytes](idem::ChunkSink& sink) {
            for (int i = 0; i < chunks; ++i)
                if (!sink.write(std::string(static_cast<std::size_t>(chunk_bytes),
                                            static_cast<char>('0' + i % 10))))
                    return;  // the client has gone
        };
        return response;
    };
}

// /flaky/orders: the (principal, key) pairs whose handler already failed once,
// in this process.
std::mutex flaky_mutex;
std::set<std::pair<std::string, std::string>> flaky_failed;

bool first_run(const std::string& principal, const std::string& key) {
    std::lock_guard<std::mutex> lock(flaky_mutex);
    return flaky_failed.emplace(principal, key).second;
}

// Fails the first run for each key with a 500, after the order was inserted:
// the client rolls the insert back and stores nothing.
idem::TransactionHandler fail_once(const std::string& principal, const std::string& key,
                                   idem::TransactionHandler create) {
    return [principal, key, create](pqxx::transaction_base& tx) -> idem::Response {
        idem::Response response = create(tx);
        if (response.status < 300 && first_run(principal, key))
            return problem(500, "Internal error",
                           "The request failed; it is safe to retry with the same key.");
        return response;
    };
}

// POST /api-keys: the response carries a secret, so it is sent once and never stored.
idem::TransactionHandler create_api_key(const std::string& principal, const std::string& body) {
    return [principal, body](pqxx::transaction_base& tx) -> idem::Response {
        nlohmann::json input = nlohmann::json::parse(body, nullptr, false);
        if (input.is_discarded() || !input.is_object() || !input.contains("name") ||
            !input["name"].is_string() || input["name"].get<std::string>().empty())
            return problem(400, "Invalid API key request",
                           "The body must be a JSON object with a non-empty \"name\" string.");
        pqxx::row row = idem::pq::exec1(
            tx,
            "INSERT INTO api_keys (principal, name) VALUES ($1, $2)"
            " RETURNING id, 'sk_' || replace(pg_catalog.gen_random_uuid()::text, '-', '')",
            principal, input["name"].get<std::string>());
        const long id = row[0].as<long>();
        idem::Response response;
        response.status = 201;
        response.body =
            nlohmann::json{
                {"id", id}, {"name", input["name"]}, {"secret", row[1].as<std::string>()}}
                .dump();
        response.headers = {{"Content-Type", "application/json"},
                            {"Location", "/api-keys/" + std::to_string(id)}};
        response.resource_id = std::to_string(id);
        response.one_time_secret = true;
        return response;
    };
}

std::string principal_of(const httplib::Request& request) {
    const std::string auth = request.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.size() > prefix.size() && auth.compare(0, prefix.size(), prefix) == 0)
        return auth.substr(prefix.size());
    return {};
}

enum class Route { idempotent, reject, plain, classic, flaky, api_key, stream };

void handle_order(const httplib::Request& in, httplib::Response& out, Route route) {
    const std::string principal = principal_of(in);
    if (principal.empty()) {
        send(out, problem(401, "Unauthorized", "Send Authorization: Bearer <token>."));
        return;
    }
    const int delay_ms =
        in.has_param("delay_ms") ? std::atoi(in.get_param_value("delay_ms").c_str()) : 0;
    try {
        Worker& w = worker();
        if (route == Route::plain) {
            pqxx::work tx(w.connection);
            idem::Response response = create_order(principal, in.body, delay_ms)(tx);
            if (response.status < 300) tx.commit();
            send(out, response);
            return;
        }
        idem::Request request;
        request.principal = principal;
        if (in.has_header("Idempotency-Key")) request.key = in.get_header_value("Idempotency-Key");
        request.method = in.method;
        request.path = in.path;
        request.body = in.body;
        if (route == Route::reject) request.duplicates = idem::Duplicates::reject;
        idem::TransactionHandler handler =
            route == Route::api_key  ? create_api_key(principal, in.body)
            : route == Route::stream ? create_stream(principal, in.body)
                                     : create_order(principal, in.body, delay_ms);
        if (route == Route::flaky && request.key)
            handler = fail_once(principal, *request.key, handler);
        if (route == Route::classic)
            send(out, w.client.handle(request, idem::Handler([&handler](pqxx::work& tx) {
                                          return handler(tx);
                                      })));
        else
            send(out, w.client.handle(request, handler));
    } catch (const pqxx::transaction_rollback& e) {
        send(out, problem(503, "Busy", "The request conflicted with another one; retry it."));
        out.set_header("Retry-After", "1");
    } catch (const std::exception& e) {
        send(out, failed(e));
    }
}

void prepare_database() {
    for (;;) {
        try {
            pqxx::connection setup(dsn);
            pqxx::work tx(setup);
            tx.exec(
                "CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, principal text NOT "
                "NULL, item text NOT NULL, quantity int NOT NULL, created_at timestamptz NOT NULL "
                "DEFAULT now())");
            tx.exec(
                "CREATE TABLE IF NOT EXISTS api_keys (id bigserial PRIMARY KEY, principal text "
                "NOT NULL, name text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())");
            tx.commit();
            return;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "orders-service: cannot prepare the database yet: %s\n", e.what());
        }
        std::this_thread::sleep_for(std::chrono::seconds(1));
    }
}

}  // namespace

int main(int argc, char** argv) {
    int port = 8080;
    int threads = 8;
    if (!examples::Flags("orders-service [--port N] [--dsn CONNINFO] [--threads N]")
             .number("--port", &port)
             .text("--dsn", &dsn)
             .number("--threads", &threads)
             .parse(argc, argv))
        return 2;
    // The tables, made once the database answers: the service starts while its database
    // is down (or restarting) and serves when it is back.
    std::thread(prepare_database).detach();

    httplib::Server server;
    server.new_task_queue = [threads] {
        return new httplib::ThreadPool(static_cast<size_t>(threads));
    };
    // Small responses must not wait for delayed ACKs (Nagle), and keep-alive
    // connections should not be closed every few requests.
    server.set_tcp_nodelay(true);
    server.set_keep_alive_max_count(1000);
    server.Post("/orders", [](const httplib::Request& in, httplib::Response& out) {
        handle_order(in, out, Route::idempotent);
    });
    server.Post("/reject/orders", [](const httplib::Request& in, httplib::Response& out) {
        handle_order(in, out, Route::reject);
    });
    server.Post("/plain/orders", [](const httplib::Request& in, httplib::Response& out) {
        handle_order(in, out, Route::plain);
    });
    server.Post("/classic/orders", [](const httplib::Request& in, httplib::Response& out) {
        handle_order(in, out, Route::classic);
    });
    server.Post("/flaky/orders", [](const httplib::Request& in, httplib::Response& out) {
        handle_order(in, out, Route::flaky);
    });
    server.Post("/orders/stream", [](const httplib::Request& in, httplib::Response& out) {
        handle_order(in, out, Route::stream);
    });
    server.Post("/api-keys", [](const httplib::Request& in, httplib::Response& out) {
        handle_order(in, out, Route::api_key);
    });
    server.Get("/orders/count", [](const httplib::Request&, httplib::Response& out) {
        try {
            pqxx::nontransaction tx(worker().connection);
            long count = idem::pq::exec1(tx, "SELECT count(*) FROM orders")[0].as<long>();
            out.set_content(nlohmann::json{{"orders", count}}.dump(), "application/json");
        } catch (const std::exception& e) {
            send(out, failed(e));
        }
    });
    server.Get("/health", [](const httplib::Request&, httplib::Response& out) {
        out.set_content("ok", "text/plain");
    });
    std::fprintf(stderr, "orders-service: listening on 127.0.0.1:%d\n", port);
    if (!server.listen("127.0.0.1", port)) {
        std::fprintf(stderr, "orders-service: cannot listen on port %d\n", port);
        return 1;
    }
    return 0;
}
