// The statement forms docs/languages.md gives for Java, run through pgjdbc as
// written there: each must run (or, where the page says so, fail with 42883).
//
//   java -cp /usr/share/java/postgresql.jar JdbcForms.java jdbc:postgresql://127.0.0.1:5432/db user
//
// Each case runs in a transaction that is rolled back. Prints ok / not ok lines
// and "N passed, N failed"; exits 1 on any failure.
import java.sql.*;

public class JdbcForms {
  interface Params { void set(PreparedStatement s) throws SQLException; }

  static int passed = 0, failed = 0;
  static final byte[] FP = new byte[32];
  static final String HEX = "00".repeat(32);
  static final String BEGIN = "SELECT * FROM idempotency.begin('p', 'k', 'a', '\\x" + HEX + "'::bytea)";
  static final String ACQUIRE = "SELECT * FROM idempotency.acquire('p', 'k', 'a', '\\x" + HEX + "'::bytea)";

  /** Runs one case; expected is null (must run) or the SQLSTATE it must fail with. */
  static void check(Connection c, String name, String expected, String setup, String sql, Params params) {
    String got = null;
    String message = "";
    try {
      c.setAutoCommit(false);
      if (setup != null) try (Statement st = c.createStatement()) { st.execute(setup); }
      try (PreparedStatement ps = c.prepareStatement(sql)) { params.set(ps); ps.execute(); }
    } catch (SQLException e) {
      got = e.getSQLState();
      message = e.getMessage().split("\n")[0];
    } finally {
      try { c.rollback(); } catch (SQLException e) { /* the next case reports it */ }
    }
    boolean ok = expected == null ? got == null : expected.equals(got);
    if (ok) passed++; else failed++;
    System.out.println((ok ? "ok - " : "not ok - ") + name + (expected == null ? "" : " (fails with " + expected + ")")
        + (ok ? "" : "\n#   got " + got + " " + message));
  }

  /** Runs every case against the database of args[0] (a JDBC URL) as args[1]. */
  public static void main(String[] args) throws Exception {
    String url = args[0];
    String user = args.length > 1 ? args[1] : "postgres";
    byte[] body = "{\"item\":\"book\"}".getBytes("UTF-8");
    try (Connection c = DriverManager.getConnection(url, user, "");
         Connection u = DriverManager.getConnection(url + (url.contains("?") ? "&" : "?") + "stringtype=unspecified", user, "")) {
      // The forms of docs/languages.md.
      for (Connection conn : new Connection[] {c, u}) {
        String via = conn == c ? "" : " [stringtype=unspecified]";
        check(conn, "begin with ?::interval casts" + via, null, null,
            "SELECT * FROM idempotency.begin(?, ?, ?, idempotency.fingerprint(?, ?, ?), ?::interval, ?::interval)", s -> {
              s.setString(1, "p"); s.setString(2, "k"); s.setString(3, "create_order");
              s.setString(4, "POST"); s.setString(5, "/orders"); s.setBytes(6, body);
              s.setNull(7, Types.OTHER); s.setString(8, "2 seconds");
            });
        check(conn, "complete with ?::jsonb" + via, null, BEGIN, "SELECT idempotency.complete(?, ?, ?, ?, ?::jsonb, ?)", s -> {
          s.setString(1, "p"); s.setString(2, "k"); s.setInt(3, 201); s.setBytes(4, body);
          s.setString(5, "{\"Location\":\"/orders/17\"}"); s.setString(6, "17");
        });
        check(conn, "acquire with ?::interval" + via, null, null,
            "SELECT * FROM idempotency.acquire(?, ?, ?, idempotency.fingerprint(?, ?, ?), ?::interval)", s -> {
              s.setString(1, "p"); s.setString(2, "k"); s.setString(3, "a"); s.setString(4, "POST");
              s.setString(5, "/x"); s.setBytes(6, body); s.setString(7, "30 seconds");
            });
        check(conn, "complete(status =>, fence =>) with setLong" + via, null, ACQUIRE,
            "SELECT idempotency.complete(?, ?, status => ?, fence => ?)", s -> {
              s.setString(1, "p"); s.setString(2, "k"); s.setInt(3, 200); s.setLong(4, 1L);
            });
        check(conn, "renew" + via, null, ACQUIRE, "SELECT idempotency.renew(?, ?, ?, ?::interval)", s -> {
          s.setString(1, "p"); s.setString(2, "k"); s.setLong(3, 1L); s.setString(4, "30 seconds");
        });
        check(conn, "release" + via, null, ACQUIRE, "SELECT idempotency.release(?, ?, ?)", s -> {
          s.setString(1, "p"); s.setString(2, "k"); s.setLong(3, 1L);
        });
        check(conn, "save_final with ?::jsonb" + via, null, null, "SELECT idempotency.save_final(?, ?, ?, ?, ?, ?, ?::jsonb)", s -> {
          s.setString(1, "p"); s.setString(2, "k"); s.setString(3, "a"); s.setBytes(4, FP); s.setInt(5, 409);
          s.setBytes(6, body); s.setString(7, "{}");
        });
        check(conn, "optional arguments: setNull OTHER, setObject null" + via, null, null,
            "SELECT * FROM idempotency.begin(?, ?, ?, ?, ?, ?)", s -> {
              s.setString(1, "p"); s.setString(2, "k"); s.setString(3, "a"); s.setBytes(4, FP);
              s.setNull(5, Types.OTHER); s.setObject(6, null);
            });
        check(conn, "fingerprint: setNull BINARY, setNull ARRAY" + via, null, null, "SELECT idempotency.fingerprint(?, ?, ?, ?)", s -> {
          s.setString(1, "POST"); s.setString(2, "/x"); s.setNull(3, Types.BINARY); s.setNull(4, Types.ARRAY);
        });
        check(conn, "fingerprint: setArray text[]" + via, null, null, "SELECT idempotency.fingerprint(?, ?, ?, ?)", s -> {
          s.setString(1, "POST"); s.setString(2, "/x"); s.setBytes(3, body);
          s.setArray(4, conn.createArrayOf("text", new Object[] {"/a"}));
        });
        check(conn, "complete/3 with setInt" + via, null, BEGIN, "SELECT idempotency.complete(?, ?, ?)", s -> {
          s.setString(1, "p"); s.setString(2, "k"); s.setInt(3, 204);
        });
        check(conn, "lookup, claim, forget" + via, null, null,
            "SELECT (SELECT count(*) FROM idempotency.lookup(?, ?)), idempotency.claim(?, ?, ?::interval), idempotency.forget(?, ?)", s -> {
              s.setString(1, "p"); s.setString(2, "k"); s.setString(3, "p"); s.setString(4, "k2");
              s.setNull(5, Types.OTHER); s.setString(6, "p"); s.setString(7, "k2");
            });
        // Without casts: fails with plain setString, runs with stringtype=unspecified, as the page says.
        String no = conn == c ? "42883" : null;
        check(conn, "begin with setString intervals, no cast" + via, no, null, "SELECT * FROM idempotency.begin(?, ?, ?, ?, ?, ?)", s -> {
          s.setString(1, "p"); s.setString(2, "k"); s.setString(3, "a"); s.setBytes(4, FP);
          s.setString(5, "1 hour"); s.setString(6, "100 ms");
        });
        check(conn, "complete with setString headers, no cast" + via, no, BEGIN, "SELECT idempotency.complete(?, ?, ?, ?, ?, ?, ?)", s -> {
          s.setString(1, "p"); s.setString(2, "k"); s.setInt(3, 201); s.setBytes(4, body);
          s.setString(5, "{\"Location\":\"/o/1\"}"); s.setString(6, "1"); s.setBoolean(7, false);
        });
        check(conn, "acquire with setString lease, no cast" + via, no, null, "SELECT * FROM idempotency.acquire(?, ?, ?, ?, ?)", s -> {
          s.setString(1, "p"); s.setString(2, "k"); s.setString(3, "a"); s.setBytes(4, FP); s.setString(5, "30 seconds");
        });
      }
    }
    System.out.println(passed + " passed, " + failed + " failed");
    System.exit(failed == 0 && passed > 0 ? 0 : 1);
  }
}
