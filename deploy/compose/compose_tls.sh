#!/bin/sh
# compose-tls COMMAND...: compose.yaml's NATS servers start through it. It makes, once, a CA
# and this server's certificate in $TLS_DIR (the project's `tls` volume), then runs COMMAND
# with NATS_TLS_CERT and NATS_TLS_KEY naming them (deploy/compose/nats.conf reads both).
#
# The CA is made by the first server to take the lock and kept while the volume is (`down -v`
# removes it); each server's certificate names its service (NATS_NAME: nats1..3) for peers'
# routes and clients in the project, and localhost and 127.0.0.1 for clients on the host
# (nats1's client port is published there). Each allows server and client auth: a route peer
# presents its certificate as a client's (docs/operations/servers.md, TLS). openssl comes with the
# image (Debian's ca-certificates depends on it).
set -eu
: "${NATS_NAME:?compose-tls: set NATS_NAME to the server's service name}"
DIR=${TLS_DIR:-/etc/vramfabric/tls}
DAYS=${TLS_DAYS:-825}
cd "$DIR"
umask 077

# Three servers start at once on one volume: one at a time makes what is missing.
exec 9>"$DIR/.lock"
flock -w 60 9 || { echo "compose-tls: $DIR/.lock held for 60 s" >&2; exit 1; }
if [ ! -s ca.pem ] || [ ! -s ca-key.pem ]; then
  echo "compose-tls: making the CA in $DIR"
  # A new CA: certificates the last one signed would no longer verify.
  rm -f ./*.pem
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -sha256 \
    -days "$DAYS" -subj "/CN=vramfabric compose CA" -keyout ca-key.tmp -out ca.tmp \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
  mv ca-key.tmp ca-key.pem
  mv ca.tmp ca.pem
  chmod 644 ca.pem
fi
if [ ! -s "$NATS_NAME.pem" ] || [ ! -s "$NATS_NAME-key.pem" ]; then
  echo "compose-tls: making the certificate of $NATS_NAME"
  printf '%s\n' "subjectAltName=DNS:$NATS_NAME,DNS:localhost,IP:127.0.0.1" \
    "extendedKeyUsage=serverAuth,clientAuth" "basicConstraints=CA:FALSE" >"$NATS_NAME.ext"
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -subj "/CN=$NATS_NAME" \
    -keyout "$NATS_NAME-key.tmp" -out "$NATS_NAME.csr" 2>/dev/null
  openssl x509 -req -in "$NATS_NAME.csr" -CA ca.pem -CAkey ca-key.pem -sha256 \
    -days "$DAYS" -set_serial "0x$(openssl rand -hex 16)" -extfile "$NATS_NAME.ext" \
    -out "$NATS_NAME.tmp" 2>/dev/null
  rm -f "$NATS_NAME.csr" "$NATS_NAME.ext"
  mv "$NATS_NAME-key.tmp" "$NATS_NAME-key.pem"
  mv "$NATS_NAME.tmp" "$NATS_NAME.pem"
fi
exec 9>&-
export NATS_TLS_CERT="$DIR/$NATS_NAME.pem" NATS_TLS_KEY="$DIR/$NATS_NAME-key.pem"
exec "$@"
