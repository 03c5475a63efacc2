# One of Katib's Go services (hack/cluster/addons/katib.sh): the static binary built from Katib's
# Go module, laid out as upstream's alpine image has it (the same folder and name, so that the
# upstream manifests' `command: ["./katib-db-manager"]` and the controller's composer work
# unchanged), FROM scratch: none of them runs a shell or another program.
FROM scratch
ARG DIR
ARG BIN
WORKDIR ${DIR}
COPY ${BIN} ${DIR}/${BIN}
# /tmp (mode 1777; the controller writes its webhook certificate under /tmp/cert): ADD unpacks
# a tar with its modes; COPY would not.
ADD tmp.tar /
USER 65532:65532
# ENTRYPOINT ["./<BIN>"] is appended by katib.sh (an exec-form ENTRYPOINT expands no ARG, and
# FROM scratch has no shell to run a shell-form one).
