# Shell helpers shared by the bench scripts (sourced, not run).

# median: the median of the numbers on standard input, one per line.
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
