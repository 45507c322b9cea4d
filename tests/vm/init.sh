#!/bin/busybox sh
# /init of the nictune test VM (busybox sh, built into the initramfs by
# tests/vm/run.py).  The host's / becomes the guest's root, read-only over
# 9p; the project directory is mounted read-write at its own path; then the
# command script named on the kernel command line runs in that root and its
# exit status is printed on the serial console before power-off.
#
# Kernel command line: nictune.project=DIR nictune.cmd=SCRIPT
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

project="" cmd=""
for word in $(cat /proc/cmdline); do
    case "$word" in
        nictune.project=*) project="${word#nictune.project=}" ;;
        nictune.cmd=*) cmd="${word#nictune.cmd=}" ;;
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

say "running $cmd"
chroot /newroot /bin/sh "$cmd" </dev/null
finish $?
