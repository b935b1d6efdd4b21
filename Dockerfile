# syntax=docker/dockerfile:1
# The gateway's container image.
#
#   docker build -t mcp-idp-gateway:0.1.0 .
#   docker run --read-only --tmpfs /tmp -p 3000:3000 \
#     -v "$PWD/config.yaml:/etc/mcp-proxy/config.yaml:ro" mcp-idp-gateway:0.1.0
#
# Layout (test/package-install.test.ts reproduces it without a Docker engine and
# runs this ENTRYPOINT, CMD and HEALTHCHECK; both install through deploy/install.sh):
#   /opt/mcp-proxy              the packed package with production dependencies only, owned by root
#   /etc/mcp-proxy/config.yaml  the configuration: mount it (a ConfigMap in Kubernetes)
#   user 1000:1000 (`node`), HOME=/tmp: /tmp is the only place it writes, so a
#   read-only root filesystem works with a tmpfs or emptyDir on /tmp
#   port 3000 for MCP traffic (set mcp.port to match); the admin listener stays
#   on 127.0.0.1:15000 inside the container, where HEALTHCHECK reaches it
#   PID 1 is tini: it forwards SIGTERM/SIGINT to node (which drains and ends its
#   stdio children) and reaps orphaned grandchildren of stdio targets, which a
#   bare node as PID 1 would leave as zombies.
ARG NODE_IMAGE=node:24-bookworm-slim

# Build: all dependencies, tsc, npm pack (prepack empties dist/, prepare builds it).
FROM ${NODE_IMAGE} AS build
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY . .
RUN mkdir /pkg && npm pack --pack-destination /pkg && mv /pkg/*.tgz /pkg/package.tgz

# Install: the tarball with production dependencies only, exactly as locked.
FROM ${NODE_IMAGE} AS install
COPY deploy/install.sh /usr/local/bin/mcp-proxy-install
COPY --from=build /pkg/package.tgz /src/package-lock.json /pkg/
RUN sh /usr/local/bin/mcp-proxy-install /pkg/package.tgz /opt/mcp-proxy /pkg/package-lock.json

FROM ${NODE_IMAGE}
RUN apt-get update \
  && apt-get install -y --no-install-recommends tini \
  && rm -rf /var/lib/apt/lists/*
COPY --from=install /opt/mcp-proxy /opt/mcp-proxy
COPY --chmod=0755 deploy/healthcheck.mjs /usr/local/bin/mcp-proxy-healthcheck
ENV NODE_ENV=production HOME=/tmp
USER 1000:1000
WORKDIR /tmp
EXPOSE 3000
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 CMD ["mcp-proxy-healthcheck", "/healthz"]
ENTRYPOINT ["/usr/bin/tini", "--", "node", "/opt/mcp-proxy/dist/bin/mcp-proxy.js"]
CMD ["-f", "/etc/mcp-proxy/config.yaml"]
