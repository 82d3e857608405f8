# For the trusted edition's run of sql/fences.sql: the last part updates the
# C++ edition from 0.7.0 (ALTER EXTENSION ... UPDATE), which the trusted edition
# has no scripts for (a new release moves the data, docs/installation.md). Left
# out: that part and its database; fences across moves, ahead of the clock and
# at the largest bigint run as they are.
/idem_fence_upgrade;$/d
/^-- The update from 0\.7\.0/,/AS sequence_comment;$/d
