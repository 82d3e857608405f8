// Shared by the examples: writes an idem::Response into a cpp-httplib response.
#pragma once

#include <string>

#include <httplib.h>

#include <idem/http.hpp>

namespace examples {

/// Copies status, headers and body; Content-Type goes through set_content as
/// cpp-httplib wants it (application/octet-stream when the response has none).
inline void send(httplib::Response& out, const idem::Response& response) {
    out.status = response.status;
    std::string content_type = "application/octet-stream";
    for (const auto& [name, value] : response.headers) {
        if (idem::header_name_equal(name, "Content-Type"))
            content_type = value;
        else
            out.set_header(name.c_str(), value);
    }
    out.set_content(response.body, content_type.c_str());
}

}  // namespace examples
