# syntax=docker/dockerfile:1.7
#
# node-diag's container image for linux/amd64 and linux/arm64:
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -t ghcr.io/node-diag/node-diag:0.1.0 --push .
#
# The builder runs on the build machine's own platform ($BUILDPLATFORM) and cross-compiles
# for the target platform, so no emulation is needed. The agent's build script compiles
# the eBPF programs through aya-build for the *target's* endianness and architecture
# (bpfel for both amd64 and arm64, with `bpf_target_arch` set to the target's arch) and
# the agent embeds that object; the last builder step checks it is there.
#
# No container engine runs on the project's CI machines, so CI proves what it can of this
# file without one (`cargo xtask test`, step "cross builds"): the same release builds for
# x86_64-unknown-linux-gnu and aarch64-unknown-linux-gnu (Debian's aarch64 cross gcc as
# linker), each checked for its embedded eBPF object.

# Toolchains: stable for the agent, a nightly for the eBPF crate (-Z build-std=core), and
# bpf-linker built against the same LLVM major as that nightly (22). A newer nightly may
# move to LLVM 23 and break bpf-linker: keep the three in step. The nightly dated
# 2026-05-20 is rustc 1.97.0-nightly (2026-05-19) with LLVM 22.1, as on the CI machines.
ARG RUST_VERSION=1.95.0
ARG RUST_NIGHTLY=nightly-2026-05-20
ARG LLVM_MAJOR=22
ARG BPF_LINKER_VERSION=0.13.0

FROM --platform=$BUILDPLATFORM debian:bookworm AS builder
ARG RUST_VERSION
ARG RUST_NIGHTLY
ARG LLVM_MAJOR
ARG BPF_LINKER_VERSION
ARG TARGETARCH
ARG BUILDARCH
ENV DEBIAN_FRONTEND=noninteractive \
    RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:$PATH \
    CARGO_TERM_COLOR=never

# LLVM 22 comes from bookworm-security (llvm-toolchain-22), as on the CI machines. The
# cross gcc (and its libc) is the linker for the other architecture; protoc compiles the
# CRI API (k8s-cri).
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends \
      ca-certificates curl gcc libc6-dev protobuf-compiler \
      llvm-${LLVM_MAJOR}-dev libpolly-${LLVM_MAJOR}-dev libzstd-dev zlib1g-dev; \
    case "${TARGETARCH}/${BUILDARCH}" in \
      arm64/amd64) apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross ;; \
      amd64/arm64) apt-get install -y --no-install-recommends gcc-x86-64-linux-gnu libc6-dev-amd64-cross ;; \
      amd64/amd64|arm64/arm64) ;; \
      *) echo "unsupported TARGETARCH/BUILDARCH ${TARGETARCH}/${BUILDARCH}" >&2; exit 1 ;; \
    esac; \
    rm -rf /var/lib/apt/lists/*

# aya-build runs `rustup run nightly cargo build -Z build-std=core ...`, always with the
# channel name `nightly`, and rustup will not link a custom toolchain under that name; so
# the pinned nightly is installed and its directory renamed to the channel's.
RUN set -eux; \
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
      | sh -s -- -y --no-modify-path --profile minimal --default-toolchain "${RUST_VERSION}"; \
    host="$(rustc -vV | sed -n 's/^host: //p')"; \
    rustup toolchain install "${RUST_NIGHTLY}" --profile minimal --component rust-src; \
    mv "${RUSTUP_HOME}/toolchains/${RUST_NIGHTLY}-${host}" "${RUSTUP_HOME}/toolchains/nightly-${host}"; \
    rustup run nightly rustc -vV | grep -q "^LLVM version: ${LLVM_MAJOR}\." \
      || { echo "nightly ${RUST_NIGHTLY} is not on LLVM ${LLVM_MAJOR}" >&2; exit 1; }; \
    rustup target add x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu; \
    LLVM_PREFIX="/usr/lib/llvm-${LLVM_MAJOR}" cargo install --locked \
      bpf-linker --version "${BPF_LINKER_VERSION}" \
      --no-default-features --features llvm-${LLVM_MAJOR}; \
    bpf-linker --version

WORKDIR /src
COPY . .

# The release build for the target platform, then the check CI makes: the binary embeds
# the eBPF object (its program names are in it).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,id=node-diag-target-${TARGETARCH} \
    set -eux; \
    case "${TARGETARCH}" in \
      amd64) target=x86_64-unknown-linux-gnu ;; \
      arm64) target=aarch64-unknown-linux-gnu ;; \
      *) echo "unsupported TARGETARCH ${TARGETARCH}" >&2; exit 1 ;; \
    esac; \
    if [ "${TARGETARCH}" != "${BUILDARCH}" ]; then \
      export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc; \
      export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=x86_64-linux-gnu-gcc; \
    fi; \
    cargo build --locked --release -p node-diag --target "${target}"; \
    install -D -m 0755 "target/${target}/release/node-diag" /out/node-diag; \
    grep -q nd_set_state /out/node-diag \
      || { echo "node-diag for ${target} embeds no eBPF object" >&2; exit 1; }

# Runtime: Debian slim with the ruleset dump tools the Service names come from
# (`iptables-nft-save`, `iptables-legacy-save`, `nft -j`: kube-proxy's rules in each of
# its modes, read in the node's namespace). The agent links glibc and libgcc only. It runs as
# uid 0 on purpose: capabilities granted by the runtime (BPF, PERFMON, NET_ADMIN,
# SYS_ADMIN in deploy/daemonset.yaml) reach the effective set of root only, as Kubernetes
# has no ambient capabilities; the DaemonSet drops every other one and mounts the root
# filesystem read-only. `node-diag run` needs those; `node-diag doctor` also runs
# unprivileged and says what is missing.
FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables nftables \
 && rm -rf /var/lib/apt/lists/*
COPY --from=builder /out/node-diag /usr/local/bin/node-diag
USER 0:0
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/node-diag"]
CMD ["run", "--listen", "0.0.0.0:9464", "--format", "json"]
