/* nlshim: an LD_PRELOAD shim that stands in for the kernel's dcbnl, so that
 * iproute2's `dcb` can be recorded on machines whose devices have no DCB.
 *
 * A test tool, never shipped.  It is compiled at test time
 * (tests/recorded/tools/dcb_recorder.py) and used like this:
 *
 *   NT_NLSHIM_LOG=/tmp/x/sent.hex NT_NLSHIM_REPLIES=/tmp/x/replies \
 *   LD_PRELOAD=/tmp/x/nlshim.so dcb ets set dev ens1f0np0 ...
 *
 * Every rtnetlink message of type RTM_GETDCB/RTM_SETDCB that the program
 * sends is appended to NT_NLSHIM_LOG as one line of hex, and is NOT passed
 * to the kernel.  Instead the shim queues what the kernel would answer:
 * the file NT_NLSHIM_REPLIES/<nlmsg_type>-<dcb cmd>.bin (a whole reply
 * message; its seq, pid and flags are patched like dcb_doit() does) and,
 * when the request asked for one, an ACK.  Without a file it answers
 * EOPNOTSUPP, as the kernel does for a device without dcbnl_ops.  Each
 * queued message is its own datagram, as the kernel sends them.  All other
 * traffic goes to the kernel untouched.  The shim machinery is shim_core.h.
 */
#define SHIM_NAME "nlshim"
#define SHIM_PROTOCOL NETLINK_ROUTE
#define SHIM_ENV_LOG "NT_NLSHIM_LOG"
#define SHIM_ENV_REPLIES "NT_NLSHIM_REPLIES"
#include "shim_core.h"

#include <linux/rtnetlink.h>

static unsigned char *load_reply(uint16_t type, uint8_t cmd, size_t *len)
{
	char name[32];

	snprintf(name, sizeof(name), "%u-%u.bin", type, cmd);
	return load_reply_file(name, len);
}

/* Returns 1 if the buffer held DCB requests (answered here), 0 if it is
 * ordinary traffic for the kernel. */
static int handle(int fd, const unsigned char *buf, size_t len)
{
	const struct nlmsghdr *nlh = (const struct nlmsghdr *)buf;
	int handled = 0;

	if (!is_ours(fd))
		return 0;
	for (; NLMSG_OK(nlh, len); nlh = NLMSG_NEXT(nlh, len)) {
		uint32_t portid;
		unsigned char *reply;
		size_t reply_len;
		uint8_t cmd;

		if (nlh->nlmsg_type != RTM_GETDCB && nlh->nlmsg_type != RTM_SETDCB)
			continue;
		handled = 1;
		log_request(nlh);
		portid = portid_of(fd);
		cmd = nlh->nlmsg_len > NLMSG_HDRLEN + 1 ? ((const uint8_t *)NLMSG_DATA(nlh))[1] : 0;
		reply = load_reply(nlh->nlmsg_type, cmd, &reply_len);
		if (!reply) {
			enqueue_ack(nlh, portid, -EOPNOTSUPP);
			continue;
		}
		if (reply_len >= NLMSG_HDRLEN) {
			struct nlmsghdr *r = (struct nlmsghdr *)reply;

			/* dcbnl_newmsg(fn->type, cmd, portid, seq, nlmsg_flags) */
			r->nlmsg_len = reply_len;
			r->nlmsg_seq = nlh->nlmsg_seq;
			r->nlmsg_pid = portid;
			r->nlmsg_flags = nlh->nlmsg_flags;
		}
		enqueue(reply, reply_len);
		if (nlh->nlmsg_flags & NLM_F_ACK)
			enqueue_ack(nlh, portid, 0);
	}
	return handled;
}
