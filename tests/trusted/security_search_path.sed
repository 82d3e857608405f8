# For the trusted edition's run of sql/security_search_path.sql: its objects
# are not members of an extension (psql -f), so "the extension's objects" are
# those that depend on the schema idempotency.
s/'pg_extension'::regclass AND e\.deptype = 'e'/'pg_namespace'::regclass AND e.deptype = 'n'/
s/(SELECT oid FROM pg_extension WHERE extname = 'idempotency')/'idempotency'::regnamespace/
# Traps also for the built-ins that only the trusted edition's bodies call
# (set-returning, polymorphic and aggregate ones get none, as for the C++ edition).
s/'ceil', 'to_char', 'jsonb_array_length')/'ceil', 'to_char', 'jsonb_array_length', 'abs', 'btrim', 'left', @1)/
s/@1)/'lpad', 'ltrim', 'position', 'regexp_match', 'regexp_replace', 'replace', @2)/
s/@2)/'round', 'rtrim', 'string_to_array', 'substr', 'to_hex', 'to_json', 'to_jsonb', @3)/
s/@3)/'translate', 'trunc', 'array_ndims', 'json_typeof', 'json_array_length', @4)/
s/@4)/'array_to_json', 'array_position', 'current_database', 'chr')/
