# The TLS reverse proxy in front of the SuperLink (docker-compose.yml's `proxy` service): Debian's nginx, with
# deploy/nginx/pflower-fleet.conf and the certificates mounted at run time.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends nginx && rm -rf /var/lib/apt/lists/* \
    && rm -f /etc/nginx/sites-enabled/default
CMD ["nginx", "-g", "daemon off;"]
