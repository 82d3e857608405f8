// idem::handle_routed: Client::handle on a connection from an idem::Router, with the one
// retry a stale placement allows.
//
//   static idem::Router router{"host=coordinator dbname=shop", {...}};
//   idem::Response response = idem::handle_routed(router, request,
//       [&](pqxx::transaction_base& tx) { ...; return created; });
//
// A stale placement refused at the key call (before the handler ran, nothing written)
// runs the request once more on a new route; anywhere else it is reported and propagates.
#pragma once

#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "idem/client.hpp"
#include "idem/router.hpp"

namespace idem {

/// One attempt of handle_routed(): handles the request with `client` (on a new connection
/// from the router) and sets `handler_ran` before the application's handler runs.
using RoutedAttempt = std::function<Response(Client& client, bool& handler_ran)>;

/// The part of handle_routed() that is not a template: connects with
/// router.connect(principal), makes a Client with `options` on that connection and runs
/// `attempt` with it, once more on a new connection after a stale placement that came
/// before the handler ran. A streamed response keeps its connection and Client until its
/// stream is dropped.
Response run_routed(Router& router, const std::string& principal, const Options& options,
                    const RoutedAttempt& attempt);

/// Handles `request` as Client::handle() does (the same outcomes, exceptions and
/// Options), on a connection of its own from router.connect(request.principal), opened for
/// this request and closed when it ends (or, for a streamed response, when its stream is
/// dropped). `handler` takes pqxx::transaction_base& (pipelined on the router's
/// idem::Connection) or pqxx::work&. A stale placement (is_stale_placement) from the key
/// call, before the handler ran, is reported to the router and the request runs once more
/// on the principal's new route; any other stale placement is reported and propagates,
/// as do the router's pqxx::broken_connection (the default target cannot be connected to
/// either) and the handler's own exceptions. Each call makes its own Client: count
/// outcomes with Router::counters() and your own metrics, not Client::counters().
template <class F>
Response handle_routed(Router& router, const Request& request, F&& handler,
                       const Options& options = {}) {
    return run_routed(router, request.principal, options, [&](Client& client, bool& ran) {
        if constexpr (std::is_invocable_r_v<Response, F&, pqxx::transaction_base&>) {
            return client.handle(request, [&](pqxx::transaction_base& tx) {
                ran = true;
                return handler(tx);
            });
        } else {
            return client.handle(request, Handler([&](pqxx::work& tx) {
                                     ran = true;
                                     return handler(tx);
                                 }));
        }
    });
}

}  // namespace idem
