// Which SQL versions of the extension (pg_extension.extversion) this library
// can serve. A library serves the schema it was built with and every older
// one (PostgreSQL's convention: a new library serves the previous release's
// schema until ALTER EXTENSION ... UPDATE runs), and refuses a schema newer
// than it knows - a backend that loaded this library before the package was
// upgraded and the schema updated - rather than running old code against it.
#pragma once

namespace idem::pg {

/// Registers the invalidation callback that forgets the checked version when
/// pg_extension changes (from _PG_init).
void schema_version_init();

/// Raises 0A000 with a hint to reconnect when the database's extension schema
/// is a version this library does not know. The version is read from the
/// catalog once per session and again only after pg_extension changed (an
/// ALTER EXTENSION ... UPDATE in any session); otherwise this is one compare.
void require_known_schema();

/// True when the database's extension schema is `version` (one this library
/// serves) or a later one: a behaviour that needs the newer schema checks it,
/// and does what the older release did otherwise. Cached as require_known_schema().
bool schema_at_least(const char* version);

}  // namespace idem::pg
