# handoff's runtime image for the mocker: Dynamo's frontend and mocker engine, nats-server, and
# handoff's own dependencies, on the Debian base that images/build.py makes with debootstrap.
# handoff itself is not in it: a run installs it from the mounted repository, as it does in a
# team's own image. Built by `nox -s runtime_images`; the context is assembled by build.py.
ARG BASE
FROM ${BASE}
# The certificate bundle the host's pip trusts, so pip here reaches the same registries.
COPY ca-certificates.crt /etc/ssl/certs/handoff-pip.crt
ENV PIP_CERT=/etc/ssl/certs/handoff-pip.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY requirements /tmp/handoff/requirements
# The packages' dependencies, read from their pyproject.toml by build.py: not the packages, so
# that a change to handoff's code needs no new image.
COPY handoff-dependencies.txt /tmp/handoff/
# No byte-compiling at install: a run compiles the modules it imports, a fraction of them.
# A setuptools recent enough to build handoff's packages, so that a run's install of them
# needs no isolated build environment (handoff.commands.container.install_script).
RUN python3 -m venv /opt/venv \
 && pip install -q --no-compile --no-deps -r /tmp/handoff/requirements/dynamo.txt \
 && pip install -q --no-compile -r /tmp/handoff/handoff-dependencies.txt \
      pytest-xdist "setuptools>=68" \
 && rm -rf /tmp/handoff /root/.cache/pip
