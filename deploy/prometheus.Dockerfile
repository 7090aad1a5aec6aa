# Prometheus from Debian's package, laid out as prom/prometheus (entrypoint /bin/prometheus, which merged-/usr
# Debian already has; config in /etc/prometheus, data in /prometheus), for engines that cannot pull it (deploy/local-images.sh).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ARG MIRROR=http://deb.debian.org/debian
# hadolint ignore=DL3008
RUN echo "deb ${MIRROR} bookworm main" > /etc/apt/sources.list \
    && apt-get update && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* \
    && install -d -o nobody -g nogroup /prometheus
USER 65534
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
