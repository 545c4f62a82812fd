# syntax=docker/dockerfile:1
# heatsink as a container: compiled in the Rust image, shipped as one stripped binary
# on Debian slim, running as an unprivileged user.
#
#   docker build -t heatsink --build-arg HEATSINK_GIT_COMMIT="$(git rev-parse HEAD)" .
#   docker run -p 6033:6033 -p 9633:9633 -v "$PWD/rules:/etc/heatsink/rules:ro" \
#     -e HEATSINK_BACKEND=db:3306 heatsink
#
# Settings come from HEATSINK_* environment variables; arguments after the image name
# go to `heatsink serve` (e.g. `heatsink --drain-timeout 10`). The health check probes
# /healthz on the metrics port: keep HEATSINK_METRICS on port 9633 or override it.
# examples/sidecar/ runs the image next to an application with docker compose.

FROM rust:1-bookworm AS build
WORKDIR /src
# Everything `cargo build --locked` reads for the binary: the manifest, the lock file,
# the build script and the sources (examples, tests and benches are not needed).
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
# .git is not in the build context: the commit `heatsink --version` and
# heatsink_build_info show comes from this argument (empty: "unknown").
ARG HEATSINK_GIT_COMMIT=""
# The registry and target directories are build caches, so a rebuild after a source
# change does not recompile the dependencies. The binary is copied out of the cache.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin heatsink \
 && install -D -m 0755 -s target/release/heatsink /out/heatsink

FROM debian:bookworm-slim
# ca-certificates: for verifying a TLS backend.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 heatsink \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin heatsink \
 && mkdir -p /etc/heatsink/rules
COPY --from=build /out/heatsink /usr/local/bin/heatsink
# Numeric, so that runAsNonRoot-style checks can verify it without /etc/passwd.
USER 10001:10001
# HEATSINK_RULES names the directory to mount rule files over; left empty, heatsink is
# a pure passthrough (and says so in its "listening on" log line).
ENV HEATSINK_LISTEN=0.0.0.0:6033 \
    HEATSINK_RULES=/etc/heatsink/rules \
    HEATSINK_METRICS=0.0.0.0:9633
EXPOSE 6033 9633
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/heatsink", "health", "--url", "http://127.0.0.1:9633/healthz"]
# SIGTERM (docker stop) drains in-flight statements; SIGHUP reloads the rules.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/heatsink", "serve"]
