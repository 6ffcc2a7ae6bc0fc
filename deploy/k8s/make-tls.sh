#!/bin/sh
# make-tls.sh OUT [NAMESPACE]: a CA and one certificate for the three NATS servers of these
# manifests, with openssl only, as the Secret `vramfabric-tls` takes them: OUT/ca.crt,
# OUT/tls.crt, OUT/tls.key (and the CA's key, OUT/ca.key, which stays with you). Then:
#
#   kubectl -n NAMESPACE create secret generic vramfabric-tls \
#     --from-file=OUT/ca.crt --from-file=OUT/tls.crt --from-file=OUT/tls.key
#
# The certificate names every server as clients and peers' routes reach it (nats-I.nats, and
# the longer names in NAMESPACE, default vramfabric) and allows server and client auth: a route
# peer presents it as a client's. An existing CA in OUT is kept (it signs the new certificate).
set -eu
OUT=${1:?usage: make-tls.sh OUT [NAMESPACE]}
NS=${2:-vramfabric}
DAYS=${TLS_DAYS:-825}
mkdir -p "$OUT"
cd "$OUT"
umask 077
if [ ! -s ca.crt ] || [ ! -s ca.key ]; then
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -sha256 \
    -days 3650 -subj "/CN=vramfabric NATS CA" -keyout ca.key -out ca.crt \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
fi
names=""
for i in 0 1 2; do
  for suffix in "" ".$NS" ".$NS.svc" ".$NS.svc.cluster.local"; do
    names="$names${names:+,}DNS:nats-$i.nats$suffix"
  done
done
printf '%s\n' "subjectAltName=$names" "extendedKeyUsage=serverAuth,clientAuth" \
  "basicConstraints=CA:FALSE" > tls.ext
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -subj "/CN=nats" \
  -keyout tls.key -out tls.csr
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -sha256 -days "$DAYS" \
  -set_serial "0x$(openssl rand -hex 16)" -extfile tls.ext -out tls.crt
rm -f tls.csr tls.ext
chmod 644 ca.crt tls.crt
echo "make-tls.sh: $OUT/ca.crt, $OUT/tls.crt, $OUT/tls.key (namespace $NS)"
