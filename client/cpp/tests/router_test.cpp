// Integration tests of idem::Router with a fake placement on one cluster: three
// databases with the extension (the default target and two "nodes"), a placement
// query that reads a table of the default database, and requests through the real
// path (Router::connect, Client::handle, a handler that writes a row; or
// idem::handle_routed). Node "a" also has the stand-in Citus catalogs of
// tests/scale-out/fake_citus.sql, so it refuses a principal moved away (shard 2) with the
// extension's own stale placement error. Connects to 127.0.0.1 on PGPORT
// (tests/integration/client.sh); skipped through pgbouncer.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "idem/client.hpp"
#include "idem/routed.hpp"
#include "idem/router.hpp"
#include "pqxx_compat.hpp"

namespace {

const std::array<const char*, 3> databases{"idem_route_cpp", "idem_route_cpp_a",
                                           "idem_route_cpp_b"};
const char* fake_placement = "SELECT node_name, node_port FROM route_fake WHERE principal = $1";

// RouterOptions::refresh and node_down in the tests that wait for them: long enough for
// a few requests on a loaded machine (each opens connections), short enough to wait for.
const std::chrono::milliseconds window(2000);

std::string dsn(const std::string& database) {
    const char* port = std::getenv("PGPORT");
    return "host=127.0.0.1 port=" + std::string(port != nullptr ? port : "5432") +
           " dbname=" + database + " connect_timeout=5";
}

std::string unique_principal(const std::string& tag) {
    static std::atomic<int> counter{0};
    return "route-" + tag + "-" +
           std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "-" +
           std::to_string(counter++);
}

void execute(const std::string& database, const std::string& sql) {
    pqxx::connection connection(dsn(database));
    pqxx::nontransaction tx(connection);
    tx.exec(sql);
}

// The text of tests/scale-out/fake_citus.sql, found from this file's path in the repository.
std::string fake_citus_sql() {
    const std::filesystem::path root =
        std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().parent_path();
    std::ifstream file(root / "tests" / "scale-out" / "fake_citus.sql");
    if (!file) throw std::runtime_error("cannot read tests/scale-out/fake_citus.sql");
    std::ostringstream text;
    text << file.rdbuf();
    return text.str();
}

// Where the principal's key rows and handler rows are: {default, a, b}, each as
// keys * 1000 + effects.
std::array<long, 3> where(const std::string& principal) {
    std::array<long, 3> found{};
    for (std::size_t i = 0; i < databases.size(); ++i) {
        pqxx::connection connection(dsn(databases[i]));
        pqxx::nontransaction tx(connection);
        const pqxx::row row = idem::pq::exec1(
            tx,
            "SELECT (SELECT count(*) FROM idempotency.keys WHERE principal = $1) * 1000 + "
            "(SELECT count(*) FROM route_effects WHERE principal = $1)",
            principal);
        found[i] = row[0].as<long>();
    }
    return found;
}

// Places `principal` on node `name`:5432 in the fake placement table.
void place(const std::string& principal, const std::string& name) {
    pqxx::connection connection(dsn(databases[0]));
    pqxx::work tx(connection);
    idem::pq::exec(tx,
                   "INSERT INTO route_fake VALUES ($1, $2, 5432) ON CONFLICT (principal) "
                   "DO UPDATE SET node_name = EXCLUDED.node_name",
                   principal, name);
    tx.commit();
}

// A port on 127.0.0.1 that refuses connections: bound, never listening.
class ClosedPort {
public:
    ClosedPort() {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t length = sizeof address;
        if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
            ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
            throw std::runtime_error("cannot bind a port on 127.0.0.1");
        }
        port_ = ntohs(address.sin_port);
    }
    ~ClosedPort() { ::close(fd_); }
    int port() const { return port_; }

private:
    int fd_ = -1;
    int port_ = 0;
};

class RouterTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        if (std::getenv("IDEM_TEST_PGBOUNCER") != nullptr) return;
        for (const char* database : databases) {
            execute("postgres",
                    std::string("DROP DATABASE IF EXISTS ") + database + " WITH (FORCE)");
            execute("postgres", std::string("CREATE DATABASE ") + database);
            execute(database, "CREATE EXTENSION idempotency");
            // Before any other session of node a: the extension reads the placement once
            // per session.
            if (std::string(database) == databases[1]) execute(database, fake_citus_sql());
            execute(database, "CREATE TABLE route_effects (principal text NOT NULL)");
        }
        execute(databases[0],
                "CREATE TABLE route_fake (principal text PRIMARY KEY, node_name text NOT NULL, "
                "node_port integer NOT NULL)");
    }

    static void TearDownTestSuite() {
        if (std::getenv("IDEM_TEST_PGBOUNCER") != nullptr) return;
        for (const char* database : databases) {
            execute("postgres",
                    std::string("DROP DATABASE IF EXISTS ") + database + " WITH (FORCE)");
        }
    }

    void SetUp() override {
        if (std::getenv("IDEM_TEST_PGBOUNCER") != nullptr) {
            GTEST_SKIP() << "the router connects to its nodes directly";
        }
    }

    static idem::RouterOptions options() {
        idem::RouterOptions options;
        options.placement_sql = fake_placement;
        return options;
    }

    static std::map<std::string, std::string> nodes() {
        return {{"a.test:5432", dsn(databases[1])}, {"b.test:5432", dsn(databases[2])}};
    }

    // One keyed request of `principal` through the router: the handler writes a row in
    // the transaction that holds the key.
    static idem::Request keyed(const std::string& principal) {
        idem::Request request;
        request.principal = principal;
        request.key = unique_principal("key");
        request.method = "POST";
        request.path = "/orders";
        request.body = R"({"item":"book"})";
        return request;
    }

    static void serve(idem::Router& router, const std::string& principal) {
        std::unique_ptr<idem::Connection> connection = router.connect(principal);
        idem::Client client(*connection);
        const idem::Request request = keyed(principal);
        idem::Response response = client.handle(request, [&](pqxx::transaction_base& tx) {
            idem::pq::exec(tx, "INSERT INTO route_effects VALUES ($1)", principal);
            idem::Response created;
            created.status = 201;
            return created;
        });
        ASSERT_EQ(response.status, 201);
    }

    // One keyed request of `principal` through idem::handle_routed, the handler as in
    // serve(); counts the handler's runs in `runs`. `refuse`: the handler's own statement
    // fails with the stale placement error.
    static idem::Response serve_routed(idem::Router& router, const std::string& principal,
                                       int& runs, bool refuse = false) {
        return idem::handle_routed(router, keyed(principal), [&](pqxx::transaction_base& tx) {
            ++runs;
            idem::pq::exec(tx, "INSERT INTO route_effects VALUES ($1)", principal);
            if (refuse)
                tx.exec(std::string("DO $$BEGIN RAISE EXCEPTION USING ERRCODE = '0A000', "
                                    "MESSAGE = ") +
                        tx.quote(idem::routing::stale_placement_message) + "; END$$");
            idem::Response created;
            created.status = 201;
            return created;
        });
    }

    // Moves `principal`'s shard off node a (the extension there refuses it from now on).
    static void move_off_a(const std::string& principal) {
        pqxx::connection connection(dsn(databases[1]));
        pqxx::work tx(connection);
        idem::pq::exec(tx, "INSERT INTO pg_catalog.fake_citus_shard VALUES ($1, 2)", principal);
        tx.commit();
    }
};

TEST_F(RouterTest, EachPrincipalRunsOnItsNode) {
    idem::Router router(dsn(databases[0]), nodes(), options());
    const std::string p1 = unique_principal("p1"), p2 = unique_principal("p2"),
                      p3 = unique_principal("p3");
    place(p1, "a.test");
    place(p2, "b.test");
    serve(router, p1);
    serve(router, p2);
    serve(router, p3);
    EXPECT_EQ(where(p1), (std::array<long, 3>{0, 1001, 0}));
    EXPECT_EQ(where(p2), (std::array<long, 3>{0, 0, 1001}));
    EXPECT_EQ(where(p3), (std::array<long, 3>{1001, 0, 0}));
    const idem::RouterCounters counters = router.counters();
    EXPECT_EQ(counters.lookups, 3u);
    EXPECT_EQ(counters.routed, 2u);
    EXPECT_EQ(counters.defaulted, 1u);
    EXPECT_EQ(counters.lookup_failures, 0u);
    EXPECT_EQ(router.route(p1).node, "a.test:5432");
    EXPECT_EQ(router.target(p2), dsn(databases[2]));
}

TEST_F(RouterTest, LooksUpOncePerRefreshAndFollowsAMove) {
    idem::RouterOptions opts = options();
    opts.refresh = window;
    idem::Router router(dsn(databases[0]), nodes(), opts);
    const std::string p = unique_principal("move");
    place(p, "a.test");
    serve(router, p);
    serve(router, p);
    EXPECT_EQ(router.counters().lookups, 1u);
    place(p, "b.test");  // the shard moves: the cached placement is stale until refresh
    serve(router, p);
    EXPECT_EQ(where(p), (std::array<long, 3>{0, 3003, 0}));
    std::this_thread::sleep_for(window + std::chrono::milliseconds(100));
    serve(router, p);
    EXPECT_EQ(where(p), (std::array<long, 3>{0, 3003, 1001}));
    EXPECT_EQ(router.counters().lookups, 2u);
    EXPECT_EQ(router.counters().routed, 4u);
}

TEST_F(RouterTest, ANodeThatCannotConnectIsMarkedDownAndTriedAgainLater) {
    ClosedPort closed;
    std::map<std::string, std::string> map = nodes();
    map["a.test:5432"] = "host=127.0.0.1 port=" + std::to_string(closed.port()) +
                         " dbname=" + databases[1] + " connect_timeout=5";
    idem::RouterOptions opts = options();
    opts.node_down = window;
    idem::Router router(dsn(databases[0]), map, opts);
    const std::string p = unique_principal("down");
    place(p, "a.test");
    serve(router, p);  // a.test refuses: the request runs on the default target
    EXPECT_EQ(where(p), (std::array<long, 3>{1001, 0, 0}));
    EXPECT_EQ(router.counters().nodes_marked_down, 1u);
    EXPECT_EQ(router.route(p).node, "");  // down: looked up again, sent to the default
    serve(router, p);
    EXPECT_EQ(router.counters().nodes_marked_down, 1u);  // not tried while down
    std::this_thread::sleep_for(window + std::chrono::milliseconds(100));
    EXPECT_EQ(router.route(p).node, "a.test:5432");  // node_down passed: tried again
    serve(router, p);
    EXPECT_EQ(router.counters().nodes_marked_down, 2u);
    EXPECT_EQ(where(p), (std::array<long, 3>{3003, 0, 0}));
}

TEST_F(RouterTest, AFailingLookupGoesToTheDefaultAndIsNotCached) {
    idem::RouterOptions opts = options();
    opts.placement_sql =
        "SELECT $1::text, (1 / (SELECT count(*) FROM route_fake WHERE false))::int";
    idem::Router router(dsn(databases[0]), nodes(), opts);
    const std::string p = unique_principal("fail");
    place(p, "a.test");
    serve(router, p);
    serve(router, p);
    EXPECT_EQ(where(p), (std::array<long, 3>{2002, 0, 0}));
    const idem::RouterCounters counters = router.counters();
    EXPECT_EQ(counters.lookups, 2u);
    EXPECT_EQ(counters.lookup_failures, 2u);
    EXPECT_EQ(counters.defaulted, 2u);
}

TEST_F(RouterTest, AnUnknownNodeGoesToTheDefault) {
    idem::Router router(dsn(databases[0]), nodes(), options());
    const std::string p = unique_principal("unknown");
    place(p, "c.test");
    serve(router, p);
    EXPECT_EQ(where(p), (std::array<long, 3>{1001, 0, 0}));
    EXPECT_EQ(router.counters().defaulted, 1u);
    EXPECT_EQ(router.counters().routed, 0u);
}

TEST_F(RouterTest, TheCacheKeepsAtMostMaxPrincipals) {
    idem::RouterOptions opts = options();
    opts.max_principals = 2;
    idem::Router router(dsn(databases[0]), nodes(), opts);
    const std::string p1 = unique_principal("lru1"), p2 = unique_principal("lru2"),
                      p3 = unique_principal("lru3");
    router.route(p1);
    router.route(p2);
    router.route(p1);  // p1 most recent: p2 goes when p3 comes
    router.route(p3);
    EXPECT_EQ(router.counters().lookups, 3u);
    router.route(p1);
    EXPECT_EQ(router.counters().lookups, 3u);
    router.route(p2);
    EXPECT_EQ(router.counters().lookups, 4u);
    opts.max_principals = 0;
    EXPECT_THROW(idem::Router(dsn(databases[0]), nodes(), opts), std::invalid_argument);
    opts = options();
    opts.placement_sql.clear();
    EXPECT_THROW(idem::Router(dsn(databases[0]), nodes(), opts), std::invalid_argument);
    opts = options();
    opts.node_down = std::chrono::milliseconds(-1);
    EXPECT_THROW(idem::Router(dsn(databases[0]), nodes(), opts), std::invalid_argument);
}

TEST_F(RouterTest, ManyThreadsShareOneRouter) {
    idem::RouterOptions opts = options();
    opts.max_principals = 5;
    idem::Router router(dsn(databases[0]), nodes(), opts);
    std::vector<std::string> principals;
    for (int i = 0; i < 8; ++i) {
        principals.push_back(unique_principal("threads"));
        place(principals.back(), i % 2 == 0 ? "a.test" : "b.test");
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&router, &principals, t] {
            for (int i = 0; i < 200; ++i) {
                const std::string& p = principals[(i + t) % principals.size()];
                EXPECT_EQ(router.route(p).node, (i + t) % 2 == 0 ? "a.test:5432" : "b.test:5432");
            }
        });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(router.counters().routed, 800u);
}

TEST_F(RouterTest, AStalePlacementIsLookedUpAgainAndTheRequestRunsOnTheNewNode) {
    idem::Router router(dsn(databases[0]), nodes(), options());  // refresh 60 s
    const std::string p = unique_principal("stale");
    place(p, "a.test");
    int runs = 0;
    EXPECT_EQ(serve_routed(router, p, runs).status, 201);  // served on a: the cache is primed
    EXPECT_EQ(where(p), (std::array<long, 3>{0, 1001, 0}));
    move_off_a(p);  // the shard moves to b; the cached placement still says a
    place(p, "b.test");
    EXPECT_EQ(serve_routed(router, p, runs).status, 201);
    EXPECT_EQ(runs, 2) << "the handler ran once for each request";
    EXPECT_EQ(where(p), (std::array<long, 3>{0, 1001, 1001}));
    const idem::RouterCounters counters = router.counters();
    EXPECT_EQ(counters.stale_placements, 1u);
    EXPECT_EQ(counters.lookups, 2u);
    EXPECT_EQ(counters.routed, 3u);  // a, a (cached, refused), b
    EXPECT_EQ(counters.nodes_marked_down, 0u);
    EXPECT_EQ(router.route(p).node, "b.test:5432");
    EXPECT_EQ(router.counters().lookups, 2u);
}

// The same through libpqxx's own statements (a pqxx::work& handler: begin is not
// pipelined, so the refusal is libpqxx's exception) and with a streamed response, whose
// stream runs after handle_routed returned, on the connection it keeps.
TEST_F(RouterTest, AStalePlacementIsRetriedWithAWorkHandlerAndAStream) {
    idem::Router router(dsn(databases[0]), nodes(), options());
    const std::string p = unique_principal("stale-work");
    place(p, "a.test");
    router.route(p);
    move_off_a(p);
    place(p, "b.test");
    int runs = 0;
    idem::Response response = idem::handle_routed(router, keyed(p), [&](pqxx::work& tx) {
        ++runs;
        idem::pq::exec(tx, "INSERT INTO route_effects VALUES ($1)", p);
        idem::Response streamed;
        streamed.status = 201;
        streamed.stream = [](idem::ChunkSink& sink) {
            sink.write("part one, ");
            sink.write("part two");
        };
        return streamed;
    });
    ASSERT_EQ(response.status, 201);
    ASSERT_TRUE(response.stream);
    struct Collect final : idem::ChunkSink {
        std::string body;
        bool write(std::string_view chunk) override {
            body += chunk;
            return true;
        }
    } sink;
    response.stream(sink);
    response = idem::Response();  // drops the stream, then its connection
    EXPECT_EQ(sink.body, "part one, part two");
    EXPECT_EQ(runs, 1);
    EXPECT_EQ(where(p), (std::array<long, 3>{0, 0, 1001}));
    EXPECT_EQ(router.counters().stale_placements, 1u);
    EXPECT_EQ(router.counters().lookups, 2u);
}

TEST_F(RouterTest, AStalePlacementTwiceFailsTheRequest) {
    idem::Router router(dsn(databases[0]), nodes(), options());
    const std::string p = unique_principal("stale-twice");
    place(p, "a.test");  // the placement still says a after the move: a refuses twice
    move_off_a(p);
    int runs = 0;
    try {
        serve_routed(router, p, runs);
        ADD_FAILURE() << "the second refusal propagates";
    } catch (const pqxx::sql_error& e) {
        EXPECT_TRUE(idem::is_stale_placement(e)) << e.what();
    }
    EXPECT_EQ(runs, 0);
    EXPECT_EQ(where(p), (std::array<long, 3>{0, 0, 0}));
    const idem::RouterCounters counters = router.counters();
    EXPECT_EQ(counters.stale_placements, 2u);
    EXPECT_EQ(counters.lookups, 2u);
    EXPECT_EQ(counters.nodes_marked_down, 0u);
}

TEST_F(RouterTest, AStalePlacementFromTheHandlerIsReportedAndNotRetried) {
    idem::Router router(dsn(databases[0]), nodes(), options());
    const std::string p = unique_principal("stale-handler");
    place(p, "b.test");
    int runs = 0;
    EXPECT_THROW(serve_routed(router, p, runs, true), pqxx::sql_error);
    EXPECT_EQ(runs, 1);
    EXPECT_EQ(where(p), (std::array<long, 3>{0, 0, 0}));  // rolled back, nothing stored
    EXPECT_EQ(router.counters().stale_placements, 1u);
    EXPECT_EQ(router.counters().lookups, 1u);
    router.route(p);  // the placement was dropped: looked up again
    EXPECT_EQ(router.counters().lookups, 2u);
}

TEST_F(RouterTest, ReportStalePlacementDropsThePlacementAndMarksNoNodeDown) {
    idem::Router router(dsn(databases[0]), nodes(), options());
    const std::string p = unique_principal("report");
    place(p, "a.test");
    EXPECT_EQ(router.route(p).node, "a.test:5432");
    EXPECT_EQ(router.route(p).node, "a.test:5432");
    EXPECT_EQ(router.counters().lookups, 1u);
    router.report_stale_placement(p);
    EXPECT_EQ(router.route(p).node, "a.test:5432");  // looked up again, a not marked down
    const idem::RouterCounters counters = router.counters();
    EXPECT_EQ(counters.lookups, 2u);
    EXPECT_EQ(counters.stale_placements, 1u);
    EXPECT_EQ(counters.nodes_marked_down, 0u);
    EXPECT_EQ(counters.routed, 3u);
}

// After one request on router.connect(principal) (the extension's library is loaded by
// then): the session's database, idempotency.routed, statement_timeout, application_name.
std::array<std::string, 4> session_of(idem::Router& router, const std::string& principal) {
    std::unique_ptr<idem::Connection> connection = router.connect(principal);
    idem::Client client(*connection);
    idem::Request request;
    request.principal = principal;
    request.key = unique_principal("key");
    request.method = "POST";
    request.path = "/orders";
    const idem::Response response = client.handle(request, [](pqxx::transaction_base&) {
        idem::Response created;
        created.status = 201;
        return created;
    });
    EXPECT_EQ(response.status, 201);
    pqxx::nontransaction tx(connection->connection());
    const pqxx::row row = idem::pq::exec1(
        tx,
        "SELECT current_database(), coalesce(current_setting('idempotency.routed', true), 'off'), "
        "current_setting('statement_timeout'), current_setting('application_name')");
    return {row[0].as<std::string>(), row[1].as<std::string>(), row[2].as<std::string>(),
            row[3].as<std::string>()};
}

// A connection the router opens to a node from its connection string (key=value or URI)
// has idempotency.routed on, before the string's own options (a later -c wins); the
// default target's has not.
TEST_F(RouterTest, ANodesConnectionIsRoutedAndKeepsItsOwnOptions) {
    const char* port = std::getenv("PGPORT");
    const std::string a_uri =
        "postgresql://127.0.0.1:" + std::string(port != nullptr ? port : "5432") + "/" +
        databases[1] +
        "?connect_timeout=5&application_name=it%27s%20a&options="
        "-c%20statement_timeout%3D4321";
    const std::string b_string = dsn(databases[2]) + " options='-c statement_timeout=1234'";
    const std::string fallback = dsn(databases[0]) + " options='-c statement_timeout=777'";
    idem::Router router(fallback, {{"a.test:5432", a_uri}, {"b.test:5432", b_string}}, options());
    const std::string pa = unique_principal("opt-a"), pb = unique_principal("opt-b"),
                      pd = unique_principal("opt-d");
    place(pa, "a.test");
    place(pb, "b.test");
    using Session = std::array<std::string, 4>;
    EXPECT_EQ(session_of(router, pa), (Session{databases[1], "on", "4321ms", "it's a"}));
    const Session b = session_of(router, pb), d = session_of(router, pd);
    EXPECT_EQ((Session{b[0], b[1], b[2]}), (Session{databases[2], "on", "1234ms"}));
    EXPECT_EQ((Session{d[0], d[1], d[2]}), (Session{databases[0], "off", "777ms"}));
    EXPECT_EQ(router.route(pb).target, b_string);  // the route is the string given
    EXPECT_EQ(router.counters().routed, 3u);
    const std::string b_off = dsn(databases[2]) + " options='-c idempotency.routed=off'";
    idem::Router off(fallback, {{"b.test:5432", b_off}}, options());
    EXPECT_EQ(session_of(off, pb)[1], "off");  // the string's own setting comes after: wins
}

}  // namespace
