#!/bin/sh
# The container's health check: asks the server in this container, with the staged CLI, whether
# it serves. Staged as bin/transpose_healthcheck by scripts/package_runtime.sh.
#   TRANSPOSE_HEALTH_SERVER  where the server listens (default 127.0.0.1:50051: the image's
#                            --address); set it when the server runs with another --address
#   TRANSPOSE_HEALTH_FLAGS   more CLI flags, e.g. "--tls --tls_ca=/certs/ca.pem" for a server with
#                            --tls_cert (then TRANSPOSE_HEALTH_SERVER must be a name the
#                            certificate carries). Health checks need no token or client certificate.
# Docker reads any exit code but 0 and 1 as reserved: `transpose health` exits 1 for NOT_SERVING,
# 2 for a usage error, 3 when the server is out of reach and 4 when no answer came in time, and
# all of them are unhealthy here.
"$(dirname "$0")/transpose" --server="${TRANSPOSE_HEALTH_SERVER:-127.0.0.1:50051}" \
  --deadline=3s ${TRANSPOSE_HEALTH_FLAGS:-} health || exit 1
