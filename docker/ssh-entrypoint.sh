#!/bin/sh
# Start sshd for user rl. Host keys are made at the first start of each container, never
# baked into the image; the authorized keys are mounted at run time.
set -eu
keys=/home/rl/.ssh/host
mkdir -p "$keys"
[ -f "$keys/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N "" -f "$keys/ssh_host_ed25519_key"
if [ ! -s /home/rl/.ssh/authorized_keys ]; then
    echo "rl_app ssh: mount your public key: -v ~/.ssh/id_ed25519.pub:/home/rl/.ssh/authorized_keys:ro" >&2
    exit 2
fi
exec /usr/sbin/sshd -D -e -f /opt/rl_app/docker/sshd_config
