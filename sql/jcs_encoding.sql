-- Invalid UTF-8 cannot reach jcs(text) in a UTF-8 database (PostgreSQL rejects it
-- at input), but it can in a SQL_ASCII database: it must be refused there (22P02).
\set VERBOSITY sqlstate
CREATE DATABASE idem_sql_ascii ENCODING 'SQL_ASCII' TEMPLATE template0;
\c idem_sql_ascii
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;
SELECT idempotency.jcs(E'"\xff"');
SELECT idempotency.jcs(E'"\xc0\xaf"');
SELECT idempotency.jcs(E'"\xed\xa0\x80"');
SELECT idempotency.jcs(E'"\xf4\x90\x80\x80"');
-- Names sorted by UTF-16 code units there too: U+1F600 before U+E000 and U+FF21.
SELECT idempotency.jcs(E'{"\xef\xbc\xa1":1,"\xf0\x9f\x98\x80":2,"\xee\x80\x80":3,"\xc3\xa9":4}')
       = E'{"\xc3\xa9":4,"\xf0\x9f\x98\x80":2,"\xee\x80\x80":3,"\xef\xbc\xa1":1}' AS utf16_order;
SELECT idempotency.jcs(E'{"\xc3\xa9":1}') = E'{"\xc3\xa9":1}' AS valid_utf8_passes;
\c contrib_regression
DROP DATABASE idem_sql_ascii;
