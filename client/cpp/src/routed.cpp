// idem::run_routed: the connection and Client of one routed request, and the retry after
// a stale placement (docs/scale-out.md, "Routing by principal").
#include "idem/routed.hpp"

#include <exception>
#include <memory>
#include <string>
#include <utility>

namespace idem {

namespace {

// One request's connection and the Client on it (destroyed in that order: client first).
struct Held {
    Held(std::unique_ptr<Connection> opened, const Options& options)
        : connection(std::move(opened)), client(*connection, options) {}
    std::unique_ptr<Connection> connection;
    Client client;
};

// A streamed response's stream that keeps its connection and Client alive until it is
// dropped, and reports a stale placement from the completion at the stream's end. Members
// are destroyed in reverse order: the stream (and the transaction it may hold) before the
// connection.
struct HeldStream {
    std::shared_ptr<Held> held;
    Router* router;
    std::string principal;
    BodyStream produce;

    void operator()(ChunkSink& sink) const {
        try {
            produce(sink);
        } catch (const std::exception& e) {
            if (is_stale_placement(e)) router->report_stale_placement(principal);
            throw;
        }
    }
};

}  // namespace

Response run_routed(Router& router, const std::string& principal, const Options& options,
                    const RoutedAttempt& attempt) {
    for (int round = 1;; ++round) {
        auto held = std::make_shared<Held>(router.connect(principal), options);
        bool handler_ran = false;
        try {
            Response response = attempt(held->client, handler_ran);
            if (response.stream)
                response.stream = HeldStream{held, &router, principal, std::move(response.stream)};
            return response;
        } catch (const std::exception& e) {
            if (!is_stale_placement(e)) throw;
            router.report_stale_placement(principal);
            // Only the key call's refusal is retried: the handler has not run, the failed
            // begin was rolled back. Once is enough; a second refusal propagates.
            if (handler_ran || round >= 2) throw;
        }
        // `held` goes here: the refused connection closes before the next one opens.
    }
}

}  // namespace idem
