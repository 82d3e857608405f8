// idem::Router: the placement cache (bounded, least recently used out first), the
// nodes marked down, and the lookup on the default target. The design, shared by
// every client package, is in docs/scale-out.md ("Routing by principal").
#include "idem/router.hpp"

#include <cstdlib>
#include <stdexcept>
#include <utility>

#include "pqxx_compat.hpp"

namespace idem {

namespace {

// The primary message in libpq's text of an error ("ERROR:  message\nDETAIL:  ..."): its
// first line without the severity and its two spaces, and without the "0A000: " that
// verbose errors put before the message.
std::string_view primary_message(std::string_view text, std::string_view sqlstate) {
    text = text.substr(0, text.find('\n'));
    const std::size_t severity = text.find(":  ");
    if (severity != std::string_view::npos) text.remove_prefix(severity + 3);
    if (!sqlstate.empty() && text.size() > sqlstate.size() + 2 &&
        text.substr(0, sqlstate.size()) == sqlstate && text.substr(sqlstate.size(), 2) == ": ")
        text.remove_prefix(sqlstate.size() + 2);
    return text;
}

// A node's connection string with `-c idempotency.routed=on` first in its options (its own
// options, else PGOPTIONS, after it: a later -c wins); as it is if libpq cannot parse it.
std::string routed_conninfo(const std::string& conninfo) {
    PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), nullptr);
    if (parsed == nullptr) return conninfo;
    std::string out;
    for (const PQconninfoOption* option = parsed; option->keyword != nullptr; ++option) {
        const std::string keyword = option->keyword;
        const bool options = keyword == "options";
        const char* own = options && !option->val ? std::getenv("PGOPTIONS") : option->val;
        if (own == nullptr && !options) continue;
        const std::string value =
            (options ? "-c idempotency.routed=on " : "") + std::string(own ? own : "");
        out += keyword + "='";
        for (const char c : value) out += (c == '\'' || c == '\\' ? "\\" : "") + std::string(1, c);
        out += "' ";
    }
    PQconninfoFree(parsed);
    return out;
}

}  // namespace

bool is_stale_placement(std::string_view sqlstate, std::string_view primary) noexcept {
    return sqlstate == routing::stale_placement_sqlstate &&
           primary == routing::stale_placement_message;
}

bool is_stale_placement(const std::exception& error) noexcept {
    const auto* sql = dynamic_cast<const pqxx::sql_error*>(&error);
    if (sql == nullptr) return false;
    const std::string_view sqlstate = sql->sqlstate();  // std::string in libpqxx 6 and 7
    return is_stale_placement(sqlstate, primary_message(sql->what(), sqlstate));
}

Router::Router(std::string default_target, std::map<std::string, std::string> nodes,
               RouterOptions options)
    : default_(std::move(default_target)), nodes_(std::move(nodes)), options_(std::move(options)) {
    if (options_.placement_sql.empty()) {
        throw std::invalid_argument("idem::Router: placement_sql is empty");
    }
    if (options_.refresh.count() < 0 || options_.node_down.count() < 0) {
        throw std::invalid_argument("idem::Router: refresh and node_down must not be negative");
    }
    if (options_.max_principals == 0) {
        throw std::invalid_argument("idem::Router: max_principals must be at least 1");
    }
}

Router::~Router() = default;

std::optional<std::string> Router::lookup(const std::string& principal) {
    std::lock_guard<std::mutex> guard(lookup_mutex_);
    try {
        if (!lookup_connection_ || lookup_connection_->raw_connection() == nullptr) {
            lookup_connection_.reset();
            lookup_connection_ = std::make_unique<Connection>(default_);
        }
        pqxx::nontransaction tx(lookup_connection_->connection());
        const pqxx::result rows = pq::exec(tx, options_.placement_sql.c_str(), principal);
        if (rows.empty() || rows.columns() < 2 || rows[0][0].is_null() || rows[0][1].is_null()) {
            return std::nullopt;
        }
        return rows[0][0].as<std::string>() + ":" + rows[0][1].as<std::string>();
    } catch (const pqxx::broken_connection&) {
        lookup_connection_.reset();  // connect again on the next lookup
        throw;
    }
}

void Router::remember(const std::string& principal, std::optional<std::string> node) {
    // Called with mutex_ held.
    const auto now = std::chrono::steady_clock::now();
    forget(principal);
    recent_.push_front(principal);
    cache_.emplace(principal, Entry{std::move(node), now, recent_.begin()});
    while (cache_.size() > options_.max_principals) {
        cache_.erase(recent_.back());
        recent_.pop_back();
    }
}

void Router::forget(const std::string& principal) {
    // Called with mutex_ held.
    auto found = cache_.find(principal);
    if (found != cache_.end()) {
        recent_.erase(found->second.order);
        cache_.erase(found);
    }
}

Route Router::route(const std::string& principal) {
    std::optional<std::string> node;
    bool known = false;
    {
        std::lock_guard<std::mutex> guard(mutex_);
        auto found = cache_.find(principal);
        if (found != cache_.end() &&
            std::chrono::steady_clock::now() - found->second.fetched < options_.refresh) {
            node = found->second.node;
            recent_.splice(recent_.begin(), recent_, found->second.order);
            known = true;
        }
    }
    bool failed = false;
    if (!known) {
        // Outside mutex_: a slow lookup holds up no other principal's cached route.
        try {
            node = lookup(principal);
        } catch (const std::exception&) {
            failed = true;  // not cached: the next request looks it up again
        }
    }
    std::lock_guard<std::mutex> guard(mutex_);
    if (!known) {
        ++counters_.lookups;
        if (failed) {
            ++counters_.lookup_failures;
        } else {
            remember(principal, node);
        }
    }
    if (node) {
        auto target = nodes_.find(*node);
        auto down = down_until_.find(*node);
        const bool is_down =
            down != down_until_.end() && std::chrono::steady_clock::now() < down->second;
        if (target != nodes_.end() && !is_down) {
            ++counters_.routed;
            return Route{target->second, *node};
        }
    }
    ++counters_.defaulted;
    return Route{default_, std::string()};
}

void Router::report_connect_failure(const std::string& principal, const std::string& node) {
    if (node.empty()) return;
    std::lock_guard<std::mutex> guard(mutex_);
    const auto now = std::chrono::steady_clock::now();
    auto& until = down_until_[node];
    if (until <= now) ++counters_.nodes_marked_down;
    until = now + options_.node_down;
    forget(principal);
}

void Router::report_stale_placement(const std::string& principal) {
    std::lock_guard<std::mutex> guard(mutex_);
    ++counters_.stale_placements;
    forget(principal);
}

std::unique_ptr<Connection> Router::connect(const std::string& principal) {
    Route chosen = route(principal);
    if (!chosen.node.empty()) {
        try {
            return std::make_unique<Connection>(routed_conninfo(chosen.target));
        } catch (const pqxx::broken_connection&) {
            report_connect_failure(principal, chosen.node);
            std::lock_guard<std::mutex> guard(mutex_);
            ++counters_.defaulted;
        }
    }
    return std::make_unique<Connection>(default_);
}

RouterCounters Router::counters() const {
    std::lock_guard<std::mutex> guard(mutex_);
    return counters_;
}

}  // namespace idem
