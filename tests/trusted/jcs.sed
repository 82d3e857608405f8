# For the trusted edition's run of sql/jcs.sql: its walk takes minutes on the
# 64 MiB document (docs/sql-reference.md, "The trusted edition"), so the run
# gives it one of 660 kB (33,000 members instead of 3,300,000).
s/^-- A 64 MiB document\.$/-- A 660 kB document (tests\/trusted\/jcs.sed; 64 MiB for the C++ edition)./
s/repeat('{"b":1\.50,"a":"xyz"},', 3300000)/repeat('{"b":1.50,"a":"xyz"},', 33000)/
