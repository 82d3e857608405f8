// Uses the installed headers and library: computes a fingerprint and, when
// given a connection string, runs one request through the protocol twice.
#include <cstdio>
#include <string>

#include <idem/client.hpp>

int main(int argc, char** argv) {
    idem::Request request;
    request.principal = "consumer";
    request.key = "consumer-key-" + std::string(argc > 2 ? argv[2] : "0");
    request.method = "POST";
    request.path = "/things";
    request.body = R"({"b":2,"a":1})";
    idem::Digest digest = idem::fingerprint(request);
    std::printf("fingerprint %02x%02x...\n", digest[0], digest[1]);
    if (argc < 2) return 0;

    // An idem::Connection and a handler on pqxx::transaction_base&: the pipelined
    // path, which needs libpq itself from the package's dependencies.
    idem::Connection connection(argv[1]);
    idem::Client client(connection);
    auto handler = [](pqxx::transaction_base&) {
        idem::Response response;
        response.status = 201;
        response.body = "made";
        return response;
    };
    idem::Response first = client.handle(request, handler);
    idem::Response again = client.handle(request, handler);
    std::printf("first %d replayed=%d, again %d replayed=%d\n", first.status, first.replayed,
                again.status, again.replayed);
    return (first.status == 201 && !first.replayed && again.status == 201 && again.replayed) ? 0
                                                                                             : 1;
}
