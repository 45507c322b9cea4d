#!/bin/busybox sh
# /init of the nictune test VM (busybox sh, built into the initramfs by
# tests/vm/run.py).  The host's / becomes the guest's root, read-only over
# 9p; the project directory is mounted read-write at its own path; then the
# command script named on the kernel command line runs in that root and its
# exit status is printed on the serial console before power-off.
#
# Kernel command line: nictune.project=DIR nictune.cmd=SCRIPT [nictune.keep=DIR]
# [nictune.init=systemd]
# nictune.keep: where the "keep" share (a host directory that outlives one
# boot: run.py boots again when a test asks) is mounted read-write.
# nictune.init=systemd: the host's systemd becomes PID 1 (tests of what
# `systemctl` does) and runs the command script as a service.
/bin/busybox mkdir -p /proc /sys /dev /newroot /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

say() { echo "nictune-vm: $*  [uptime $(cut -d" " -f1 /proc/uptime) s]"; }
finish() {
    say "exit $1"
    sync
    poweroff -f
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

project="" cmd="" keep="" init=""
for word in $(cat /proc/cmdline); do
    case "$word" in
        nictune.project=*) project="${word#nictune.project=}" ;;
        nictune.cmd=*) cmd="${word#nictune.cmd=}" ;;
        nictune.keep=*) keep="${word#nictune.keep=}" ;;
        nictune.init=*) init="${word#nictune.init=}" ;;
    esac
done

for module in $(cat /modules.order); do
    insmod "/modules/$module" || { say "insmod $module failed"; finish 125; }
done

# msize: 9p's 8 KiB default makes every Python import crawl.  cache=loose on
# both: the guest only reads the project (no .pyc, no pytest cache; its temp
# files are on tmpfs), and caching saves about a quarter of the CPU time.
p9="trans=virtio,version=9p2000.L,msize=262144,cache=loose"
mount -t 9p -o "$p9,ro" hostroot /newroot || { say "cannot mount the host root"; finish 125; }
for dir in run tmp var/tmp; do
    mount -t tmpfs tmpfs "/newroot/$dir"
done
# A project below /tmp needs its mount point made in the fresh tmpfs.
mkdir -p "/newroot$project" 2>/dev/null
mount -t 9p -o "$p9" project "/newroot$project" || { say "cannot mount $project"; finish 125; }
if [ -n "$keep" ]; then
    # cache=none: what one boot wrote must be on the host's disk at power-off.
    mkdir -p "/newroot$keep"
    mount -t 9p -o "trans=virtio,version=9p2000.L,msize=262144,cache=none" keep "/newroot$keep" \
        || { say "cannot mount the keep share at $keep"; finish 125; }
fi
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/shm /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts

# The kernel runs /proc/sys/kernel/modprobe in this (initramfs) root for
# its own module requests (rdma_rxe asks for crc32, `ip link add` for veth):
# send them to the real modprobe of the host root.
printf '#!/bin/sh\nexec /bin/busybox chroot /newroot /sbin/modprobe "$@"\n' > /sbin/nictune-modprobe
chmod 755 /sbin/nictune-modprobe
echo /sbin/nictune-modprobe > /proc/sys/kernel/modprobe

if [ "$init" = systemd ]; then
    # The unit directory (read-only on the host's root) becomes a tmpfs; the
    # command is a runtime unit, the one unit systemd starts (it pulls in
    # what `systemctl start` of another asks for), which powers off after.
    # The initramfs is gone after switch_root: modules come from the real
    # modprobe; systemd mounts /proc, /sys and /dev itself.
    mount -t tmpfs -o mode=0755 tmpfs /newroot/etc/systemd/system
    mkdir -p /newroot/run/systemd/system
    cat > /newroot/run/systemd/system/nictune-vm.service <<UNIT
[Unit]
Description=nictune VM command
DefaultDependencies=no
SuccessAction=poweroff-force
FailureAction=poweroff-force
[Service]
Type=oneshot
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
ExecStart=/bin/sh -c 'echo "nictune-vm: running $cmd"; /bin/sh $cmd </dev/null; echo "nictune-vm: exit \$\$?"'
UNIT
    echo /sbin/modprobe > /proc/sys/kernel/modprobe
    umount /newroot/dev/pts /newroot/dev/shm /newroot/dev /newroot/sys /newroot/proc
    exec switch_root /newroot /lib/systemd/systemd systemd.unit=nictune-vm.service \
        systemd.show_status=0
fi
say "running $cmd"
chroot /newroot /bin/sh "$cmd" </dev/null
finish $?
