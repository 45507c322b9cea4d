/* ioctlshim: an LD_PRELOAD shim that stands in for the kernel's SIOCETHTOOL
 * tunable ioctls (ETHTOOL_GTUNABLE / ETHTOOL_STUNABLE), so that ethtool's
 * --get-tunable / --set-tunable can be recorded on machines whose devices
 * have no tunables.  A test tool, never shipped; compiled at test time by
 * tests/recorded/tools/tunable_recorder.py and used like this:
 *
 *   NT_IOCTLSHIM_LOG=/tmp/x/sent.hex NT_IOCTLSHIM_VALUE=100 \
 *   LD_PRELOAD=/tmp/x/ioctlshim.so ethtool --set-tunable ens1f0np0 ...
 *
 * Every SIOCETHTOOL ioctl is appended to NT_IOCTLSHIM_LOG as one line,
 * "<ifr_name> <hex>", and does NOT reach the kernel.  For a tunable the
 * hex is the whole struct ethtool_tunable with its data (16 + len bytes);
 * a GET is answered with NT_IOCTLSHIM_VALUE in the data (host byte order,
 * as the kernel copies the driver's value out).  NT_IOCTLSHIM_ERRNO makes
 * every tunable ioctl fail with that errno.  Any other ethtool command is
 * logged by its 4-byte cmd and answered EOPNOTSUPP, as a device without
 * the operation answers.  Other ioctls go to the kernel untouched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void log_bytes(const char *ifname, const unsigned char *data, size_t len)
{
	const char *path = getenv("NT_IOCTLSHIM_LOG");
	FILE *f;
	size_t i;

	if (!path)
		return;
	f = fopen(path, "a");
	if (!f)
		return;
	fprintf(f, "%s ", ifname);
	for (i = 0; i < len; i++)
		fprintf(f, "%02x", data[i]);
	fputc('\n', f);
	fclose(f);
}

int ioctl(int fd, unsigned long request, ...)
{
	static int (*real_ioctl)(int, unsigned long, ...);
	struct ethtool_tunable *tuna;
	const char *fail, *value;
	struct ifreq *ifr;
	uint32_t cmd;
	va_list ap;
	void *arg;

	va_start(ap, request);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!real_ioctl)
		real_ioctl = dlsym(RTLD_NEXT, "ioctl");
	if (request != SIOCETHTOOL)
		return real_ioctl(fd, request, arg);

	ifr = arg;
	memcpy(&cmd, ifr->ifr_data, sizeof(cmd));
	if (cmd != ETHTOOL_GTUNABLE && cmd != ETHTOOL_STUNABLE) {
		log_bytes(ifr->ifr_name, (const unsigned char *)ifr->ifr_data, sizeof(cmd));
		errno = EOPNOTSUPP;
		return -1;
	}
	tuna = (struct ethtool_tunable *)ifr->ifr_data;
	log_bytes(ifr->ifr_name, (const unsigned char *)tuna, sizeof(*tuna) + tuna->len);
	fail = getenv("NT_IOCTLSHIM_ERRNO");
	if (fail) {
		errno = atoi(fail);
		return -1;
	}
	value = getenv("NT_IOCTLSHIM_VALUE");
	if (cmd == ETHTOOL_GTUNABLE && value) {
		unsigned long v = strtoul(value, NULL, 0);

		if (tuna->len == sizeof(uint16_t)) {
			uint16_t v16 = (uint16_t)v;

			memcpy(tuna->data, &v16, sizeof(v16));
		} else if (tuna->len == sizeof(uint32_t)) {
			uint32_t v32 = (uint32_t)v;

			memcpy(tuna->data, &v32, sizeof(v32));
		}
	}
	return 0;
}
