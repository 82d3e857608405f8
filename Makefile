# PGXS build of the idempotency extension (C++17).
#   make && make install     build and install into the server found by pg_config
#   make installcheck        pg_regress (sql/, expected/) and isolation specs
#                            (tests/isolation) against a running server
EXTENSION  = idempotency
# The version lives in one place, the file VERSION (CMake reads it too); the
# control file's default_version is written from it.
EXTVERSION := $(shell cat $(dir $(lastword $(MAKEFILE_LIST)))VERSION)
# Releases in order; the first has a full script, each later one an upgrade script.
RELEASES   = 0.1.0 0.2.0 0.3.0 0.4.0 0.5.0 0.6.0 0.7.0 0.8.0 $(EXTVERSION)

MODULE_big = idempotency
OBJS = src/extension/module.o \
       src/extension/settings.o \
       src/extension/jcs_sql.o \
       src/extension/arguments.o \
       src/extension/key_lock.o \
       src/extension/pending.o \
       src/extension/key_row.o \
       src/extension/key_table.o \
       src/extension/key_store.o \
       src/extension/key_direct.o \
       src/extension/key_statements.o \
       src/extension/placement.o \
       src/extension/shard_relation.o \
       src/extension/routed.o \
       src/extension/outcome.o \
       src/extension/outcome_row.o \
       src/extension/outcome_counts.o \
       src/extension/snapshot_check.o \
       src/extension/transactional.o \
       src/extension/lease.o \
       src/extension/one_key.o \
       src/extension/batch_arguments.o \
       src/extension/batch.o \
       src/extension/counters.o \
       src/extension/counters_sql.o \
       src/extension/schema_version.o \
       src/core/jcs.o \
       src/core/jcs_pointers.o \
       src/core/jcs_decimal.o \
       src/core/fingerprint.o \
       src/core/statuses.o

# The install script of the current release is the first release's script
# followed by every upgrade script in order, so a fresh install and an upgraded
# one run the same statements (released scripts are frozen in extension/).
UPGRADE_SCRIPTS = $(shell set -- $(RELEASES); prev=$$1; shift; for v; do echo extension/$(EXTENSION)--$$prev--$$v.sql; prev=$$v; done)
DATA_built = build/$(EXTENSION)--$(EXTVERSION).sql
DATA = extension/$(EXTENSION)--$(firstword $(RELEASES)).sql $(UPGRADE_SCRIPTS)
# Not the folder build/: a CMake build tree may live there too (installation.md's
# `cmake -B build`); PGXS's clean removes the DATA_built script inside it.
EXTRA_CLEAN = output_iso

REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --inputdir=. --load-extension=$(EXTENSION)
ISOLATION = $(patsubst tests/isolation/specs/%.spec,%,$(sort $(wildcard tests/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=tests/isolation --load-extension=$(EXTENSION)

PG_CONFIG ?= pg_config
PG_CPPFLAGS += -I$(srcdir)/src/core -I$(srcdir)/src/extension
# PostgreSQL headers still say `register`, which C++17 removed.
PG_CXXFLAGS += -std=c++17 -Wno-register -Wextra -Wno-unused-parameter -Wno-missing-field-initializers
ifeq ($(WERROR),1)
PG_CXXFLAGS += -Werror
endif
SHLIB_LINK += -lstdc++ -lcrypto

# Debian's server is built with LLVM; we ship no bitcode for JIT inlining.
override with_llvm := no

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS installs the control file from the top folder; ours lives in extension/.
$(EXTENSION).control: extension/$(EXTENSION).control Makefile VERSION
	sed "s/^default_version = .*/default_version = '$(EXTVERSION)'/" $< > $@
all: $(EXTENSION).control
EXTRA_CLEAN += $(EXTENSION).control

build/$(EXTENSION)--$(EXTVERSION).sql: extension/$(EXTENSION)--$(firstword $(RELEASES)).sql $(UPGRADE_SCRIPTS) Makefile
	@mkdir -p build
	{ cat $<; for f in $(UPGRADE_SCRIPTS); do echo; grep -v '^\\echo ' $$f; done; } > $@

# The pg_regress files of tests/no_preload, for a server that does NOT preload
# the library (settings set before it loads; counters off): run by
# tests/integration/no_preload.sh against a second cluster.
NO_PRELOAD_REGRESS = $(patsubst tests/no_preload/sql/%.sql,%,$(sort $(wildcard tests/no_preload/sql/*.sql)))
installcheck-nopreload:
	$(pg_regress_installcheck) --inputdir=tests/no_preload --outputdir=output_nopreload \
	    --load-extension=$(EXTENSION) $(NO_PRELOAD_REGRESS)
EXTRA_CLEAN += output_nopreload output_trusted
.PHONY: installcheck-nopreload

# The trusted edition (SQL and PL/pgSQL only, for managed services that refuse
# C extensions): build/trusted/idempotency--$(EXTVERSION).sql for psql -f by the
# database owner, and its pg_tle form beside it. Sources in trusted/.
trusted: build/trusted/$(EXTENSION)--$(EXTVERSION).sql
build/trusted/$(EXTENSION)--$(EXTVERSION).sql: $(sort $(wildcard trusted/*.sql)) tools/trusted.sh VERSION \
    extension/$(EXTENSION)--0.8.0--0.9.0.sql
	tools/trusted.sh $(EXTVERSION) build/trusted
.PHONY: trusted
