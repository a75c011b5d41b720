# nginx.Dockerfile - nginx in front of ddpmd (docker/compose.yaml): Debian's nginx with
# docker/nginx.conf, rendered at start from NGINX_LISTEN and DDPMD_UPSTREAM, run as a non-root
# user in the foreground. Build it with docker/build.sh ddpmd-nginx docker/nginx.Dockerfile.
ARG BASE=ddpmd-base:bookworm
FROM ${BASE}
COPY docker/apt/ /etc/apt/
RUN apt-get update -qq && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx >/dev/null && \
    rm -rf /var/lib/apt/lists/* && \
    useradd --uid 10002 --user-group --no-create-home --home-dir /var/lib/ddpmd-nginx --shell /usr/sbin/nologin ddpmd-nginx && \
    mkdir -p /var/lib/ddpmd-nginx/tmp && chown -R ddpmd-nginx:ddpmd-nginx /var/lib/ddpmd-nginx
COPY docker/nginx.conf /etc/ddpmd-nginx/nginx.conf.in
COPY docker/nginx-entrypoint.sh /usr/local/bin/ddpmd-nginx
ENV NGINX_LISTEN=8080 DDPMD_UPSTREAM=ddpmd:8080
USER ddpmd-nginx
EXPOSE 8080
STOPSIGNAL SIGQUIT
ENTRYPOINT ["/bin/bash", "/usr/local/bin/ddpmd-nginx"]
