// Shared by the examples: writes an idem::Response into a cpp-httplib response.
#pragma once

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include <httplib.h>

#include <idem/http.hpp>

namespace examples {

/// cpp-httplib's chunked writer as the client's ChunkSink: one write, one chunk on the wire.
class HttplibSink final : public idem::ChunkSink {
public:
    explicit HttplibSink(httplib::DataSink& sink) : sink_(sink) {}
    bool write(std::string_view chunk) override {
        return sink_.is_writable() && sink_.write(chunk.data(), chunk.size());
    }

private:
    httplib::DataSink& sink_;
};

/// Copies status, headers and body; Content-Type goes through set_content as
/// cpp-httplib wants it (application/octet-stream when the response has none).
/// A streamed response (response.stream) is sent with chunked transfer: cpp-httplib
/// calls the provider after the status and headers, on the same thread; when the stream
/// throws, the connection is closed without the last chunk (the client sees it broken).
inline void send(httplib::Response& out, const idem::Response& response) {
    out.status = response.status;
    std::string content_type = "application/octet-stream";
    for (const auto& [name, value] : response.headers) {
        if (idem::header_name_equal(name, "Content-Type"))
            content_type = value;
        else
            out.set_header(name.c_str(), value);
    }
    if (!response.stream) {
        out.set_content(response.body, content_type.c_str());
        return;
    }
    out.set_chunked_content_provider(content_type.c_str(),
                                     [stream = response.stream](size_t, httplib::DataSink& sink) {
                                         try {
                                             HttplibSink chunks(sink);
                                             stream(chunks);
                                         } catch (const std::exception& e) {
                                             std::fprintf(stderr, "stream failed: %s\n", e.what());
                                             return false;
                                         }
                                         sink.done();
                                         return true;
                                     });
}

}  // namespace examples
