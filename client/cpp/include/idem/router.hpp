// idem::Router: sends a principal's requests to the Citus node that holds the
// principal's shard of idempotency.keys (and of the application's co-located tables),
// so the whole request transaction runs there without a hop through another node.
//
//   idem::Router router{"host=coordinator dbname=shop",
//                       {{"worker-1:5432", "host=worker-1 dbname=shop"},
//                        {"worker-2:5432", "host=worker-2 dbname=shop"}}};
//   std::unique_ptr<idem::Connection> connection = router.connect(request.principal);
//   idem::Client client{*connection};
//   client.handle(request, [&](pqxx::transaction_base& tx) { ... });
//
// Correctness never depends on the router: under Citus any node runs any principal's
// calls (it delegates them to the shard's node); routing only saves that hop. A stale
// placement (report_stale_placement, idem::handle_routed) costs the hop or one more try.
// docs/scale-out.md has the design.
//
// Thread-safe: one Router for the whole process.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "idem/connection.hpp"
#include "idem/protocol_gen.hpp"  // idem::routing: placement query, defaults, stale placement

namespace idem {

/// True when `sqlstate` and `primary_message` (libpq's PG_DIAG_MESSAGE_PRIMARY) are the
/// routing::stale_placement_sqlstate and message: "the key's shard is not on this node".
bool is_stale_placement(std::string_view sqlstate, std::string_view primary_message) noexcept;

/// True when `error` is a pqxx::sql_error (or a subclass) with SQLSTATE 0A000 and exactly
/// the protocol's message as the first line of its text after the severity ("ERROR:  ").
bool is_stale_placement(const std::exception& error) noexcept;

/// How a Router looks placements up and how long it keeps what it learnt.
struct RouterOptions {
    /// Run on the default target with the principal as $1; returns zero or one row
    /// (node name text, node port integer). Tests pass a query on a table of their own.
    std::string placement_sql = routing::placement_sql;
    /// How long a principal's placement (or "no placement") is kept.
    std::chrono::milliseconds refresh = std::chrono::seconds(routing::default_refresh_seconds);
    /// How long a node that could not be connected to gets nothing.
    std::chrono::milliseconds node_down = std::chrono::seconds(routing::default_node_down_seconds);
    /// Most principals kept in the placement cache (at least 1).
    std::size_t max_principals = routing::default_max_principals;
};

/// Counts since the router was created (for metrics).
struct RouterCounters {
    /// Placement queries run, and those that failed (error, timeout, lost connection).
    unsigned long long lookups = 0, lookup_failures = 0;
    /// Routes to a named node, and to the default target (no placement, a node the router
    /// has no target for, a node marked down, a failed lookup, a failed connect's fallback).
    unsigned long long routed = 0, defaulted = 0;
    /// Connect failures reported while the node was not already marked down.
    unsigned long long nodes_marked_down = 0;
    /// Calls that answered the principal's shard is not on their node (placement dropped).
    unsigned long long stale_placements = 0;
};

/// Where one principal's request goes.
struct Route {
    /// The connection string given for it (connect() adds idempotency.routed to a node's).
    std::string target;
    /// The Citus node name ("host:port") it stands for; empty for the default target.
    std::string node;
};

/// Routes requests by principal to the node that holds the principal's shard.
class Router {
public:
    /// `default_target`: the coordinator's (or any node's) connection string, for lookups and
    /// principals without a usable node; `nodes`: "nodename:nodeport" -> the node's string.
    /// Throws std::invalid_argument for an empty placement_sql, a negative refresh or
    /// node_down, or max_principals 0.
    Router(std::string default_target, std::map<std::string, std::string> nodes,
           RouterOptions options = {});
    ~Router();

    Router(const Router&) = delete;
    Router& operator=(const Router&) = delete;

    /// The route of `principal`: the cached placement, else one looked up now; the default
    /// target when it has none, its node is unknown or marked down, or the lookup fails.
    Route route(const std::string& principal);

    /// The connection string of route(principal).
    std::string target(const std::string& principal) { return route(principal).target; }

    /// Connecting to `node` for `principal` failed (refused, not resolved, timed out): the
    /// node gets nothing for node_down, the placement is looked up again; "" is ignored.
    void report_connect_failure(const std::string& principal, const std::string& node);

    /// Tells the router that a call for `principal` was refused by is_stale_placement: drops
    /// its cached placement (looked up again next) and counts it; marks no node down.
    /// idem::handle_routed calls it; with your own connections, call it, roll back, reroute.
    void report_stale_placement(const std::string& principal);

    /// A new connection on route(principal), a node's with `-c idempotency.routed=on` in its
    /// options (not the default's); when the node cannot be connected to, reports it and
    /// connects to the default target, else throws pqxx::broken_connection.
    std::unique_ptr<Connection> connect(const std::string& principal);

    /// Counts so far (a copy, taken under the router's lock).
    RouterCounters counters() const;

    /// The default target's connection string.
    const std::string& default_target() const noexcept { return default_; }

private:
    struct Entry {
        std::optional<std::string> node;  // empty: no placement
        std::chrono::steady_clock::time_point fetched;
        std::list<std::string>::iterator order;  // in recent_
    };

    // The node of `principal` by placement_sql; nullopt for none; throws when it fails.
    std::optional<std::string> lookup(const std::string& principal);
    void remember(const std::string& principal, std::optional<std::string> node);
    void forget(const std::string& principal);  // drops its cached placement, if any

    const std::string default_;
    const std::map<std::string, std::string> nodes_;
    const RouterOptions options_;

    mutable std::mutex mutex_;  // guards everything below but the lookup connection
    std::unordered_map<std::string, Entry> cache_;
    std::list<std::string> recent_;  // principals, most recently used first
    std::unordered_map<std::string, std::chrono::steady_clock::time_point> down_until_;
    RouterCounters counters_;

    std::mutex lookup_mutex_;  // guards the lookup connection (one lookup at a time)
    std::unique_ptr<Connection> lookup_connection_;
};

}  // namespace idem
