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
// calls (it delegates them to the shard's node). Routing only saves that hop. A stale
// placement (after a shard move, until `refresh` passes) sends requests to the old node,
// which answers correctly, only slower; or, when Citus did not delegate the call, refuses
// it with 0A000 "the key's shard is not on this node" (is_stale_placement). Then
// report_stale_placement() drops the placement so the next request looks it up again;
// idem::handle_routed (idem/routed.hpp) does that and runs the request once more on the
// new route. docs/scale-out.md has the design.
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
#include "idem/protocol_gen.hpp"

namespace idem {

// idem::routing (the placement query, the defaults, the stale placement refusal) is
// generated from client/protocol.json `routing` into idem/protocol_gen.hpp.

/// True when `sqlstate` and `primary_message` (the error's message without severity,
/// detail or hint: libpq's PG_DIAG_MESSAGE_PRIMARY) are the extension's "the key's shard
/// is not on this node": routing::stale_placement_sqlstate and stale_placement_message.
bool is_stale_placement(std::string_view sqlstate, std::string_view primary_message) noexcept;

/// True when `error` is a pqxx::sql_error (or one of its subclasses, such as
/// pqxx::feature_not_supported) that is a stale placement: SQLSTATE 0A000 and, as the
/// first line of its text after the severity ("ERROR:  "), exactly the protocol's message.
/// Any other 0A000 (another feature not supported) and any other error are not.
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
    /// Calls that answered the principal's shard is not on their node; its placement was
    /// dropped (report_stale_placement).
    unsigned long long stale_placements = 0;
};

/// Where one principal's request goes.
struct Route {
    /// The libpq connection string to connect with.
    std::string target;
    /// The Citus node name ("host:port") it stands for; empty for the default target.
    std::string node;
};

/// Routes requests by principal to the node that holds the principal's shard.
class Router {
public:
    /// `default_target`: connection string of the coordinator (or any node), where
    /// placements are looked up and where a principal without a known node goes.
    /// `nodes`: Citus node name "nodename:nodeport" -> connection string of that node.
    /// Throws std::invalid_argument for an empty placement_sql, a negative refresh or
    /// node_down, or max_principals 0.
    Router(std::string default_target, std::map<std::string, std::string> nodes,
           RouterOptions options = {});
    ~Router();

    Router(const Router&) = delete;
    Router& operator=(const Router&) = delete;

    /// The route of `principal`: the cached placement, else one looked up now (on the
    /// default target); the default target when it has none, when its node is unknown
    /// or marked down, or when the lookup fails.
    Route route(const std::string& principal);

    /// The connection string of route(principal).
    std::string target(const std::string& principal) { return route(principal).target; }

    /// Tells the router that connecting to `node` for `principal` failed (refused, name
    /// not resolved, timed out): the node gets nothing for RouterOptions::node_down and
    /// the principal's placement is looked up again. An empty node is ignored.
    void report_connect_failure(const std::string& principal, const std::string& node);

    /// Tells the router that a call for `principal` answered that the principal's shard is
    /// not on the node it ran on (is_stale_placement: the shard moved): drops the
    /// principal's cached placement, so its next route() looks it up again, and counts it
    /// in RouterCounters::stale_placements. Marks no node down (the node is up, it only
    /// no longer holds this shard). idem::handle_routed calls it; with connections of your
    /// own, call it when is_stale_placement(error) holds, roll back, and take a new route.
    void report_stale_placement(const std::string& principal);

    /// A new connection on route(principal); when that node cannot be connected to,
    /// reports it and connects to the default target instead. Throws
    /// pqxx::broken_connection when the default target cannot be connected to either.
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
