# Multi-stage build: compile in the Rust image, ship only the binary on Debian slim.
#   docker build -t heatsink .
#   docker run -p 6033:6033 -v $PWD/rules:/etc/heatsink/rules heatsink --backend db:3306
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY examples ./examples
RUN cargo build --release --locked --bin heatsink && strip target/release/heatsink

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home heatsink \
 && mkdir -p /etc/heatsink/rules && chown -R heatsink /etc/heatsink
COPY --from=build /src/target/release/heatsink /usr/local/bin/heatsink
USER heatsink
ENV HEATSINK_LISTEN=0.0.0.0:6033 \
    HEATSINK_RULES=/etc/heatsink/rules \
    HEATSINK_METRICS=0.0.0.0:9633
EXPOSE 6033 9633
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/heatsink", "health", "--url", "http://127.0.0.1:9633/healthz"]
ENTRYPOINT ["/usr/local/bin/heatsink", "serve"]
