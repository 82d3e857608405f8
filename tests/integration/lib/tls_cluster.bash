# Shared by tests/integration/rust_client.sh and client/rust/tools/msrv.sh (sourced, not
# run): a throwaway cluster with ssl = on and a certificate of a CA made here with openssl,
# for client/rust/tests/tls.rs. The extension must be installed (scripts/pgcluster.sh
# preloads it).

tls_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)

# tls_certificates DIR: in DIR/certs a CA (ca.pem), the server's certificate for 127.0.0.1
# and localhost signed by it (server.pem, server.key), and another CA whose trust must not
# be enough (other.pem).
tls_certificates() (
  mkdir -p "$1/certs" && cd "$1/certs" &&
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=idem-test-ca \
      -keyout ca.key -out ca.pem &&
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=idem-other-ca \
      -keyout other.key -out other.pem &&
    openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr &&
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' >ext.cnf &&
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
      -extfile ext.cnf -out server.pem &&
    chmod 600 server.key && { [[ $(id -u) -ne 0 ]] || chown postgres:postgres server.key server.pem; }
)

# tls_cluster_start DIR PORT: the cluster in DIR/pg on 127.0.0.1:PORT, ssl = on with
# DIR/certs (tls_certificates), the extension in its database postgres. DIR's parent must
# let the server's user through. Stop it with tls_cluster_stop DIR.
tls_cluster_start() {
  chmod o+rx "$(dirname "$1")" "$1" "$1/certs"
  PGCLUSTER_CONF="ssl = on
ssl_cert_file = '$1/certs/server.pem'
ssl_key_file = '$1/certs/server.key'" "$tls_repo/scripts/pgcluster.sh" start "$1/pg" "$2" >/dev/null &&
    psql -X -q -h 127.0.0.1 -p "$2" -U postgres -d postgres -c "CREATE EXTENSION idempotency"
}

# tls_cluster_stop DIR: stops the cluster of tls_cluster_start and removes DIR/pg.
tls_cluster_stop() {
  "$tls_repo/scripts/pgcluster.sh" stop "$1/pg" >/dev/null 2>&1 || true
}
