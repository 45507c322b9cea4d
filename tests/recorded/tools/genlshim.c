/* genlshim: an LD_PRELOAD shim that stands in for a generic netlink family
 * the running kernel lacks (devlink here: the host kernel has none), so
 * that iproute2's `devlink` (and `ip macsec`) can be recorded.  A test tool,
 * never shipped, compiled at test time by tests/recorded/tools/recording.py.
 *
 *   NT_GENLSHIM_FAMILY=devlink NT_GENLSHIM_LOG=/tmp/x/sent.hex \
 *   NT_GENLSHIM_REPLIES=/tmp/x/replies LD_PRELOAD=/tmp/x/genlshim.so devlink ...
 *
 * CTRL_CMD_GETFAMILY for NT_GENLSHIM_FAMILY is answered here with a
 * CTRL_CMD_NEWFAMILY naming id GENLSHIM_ID (0x7e), as genl_ctrl_fill_info()
 * lays it out (FAMILY_ID, FAMILY_NAME, VERSION, HDRSIZE, MAXATTR), and an
 * ACK.  Every message to that id is appended to NT_GENLSHIM_LOG as a line
 * of hex, never reaches the kernel, and is answered with
 * NT_GENLSHIM_REPLIES/<cmd>.bin when that exists (seq/pid patched), then
 * NLMSG_DONE for a dump or an ACK when asked.  Other traffic goes to the
 * kernel untouched.  The shim machinery, shared with nlshim.c, is
 * shim_core.h.
 */
#define SHIM_NAME "genlshim"
#define SHIM_PROTOCOL NETLINK_GENERIC
#define SHIM_ENV_LOG "NT_GENLSHIM_LOG"
#define SHIM_ENV_REPLIES "NT_GENLSHIM_REPLIES"
#include "shim_core.h"

#include <linux/genetlink.h>

static unsigned char *load_reply(uint8_t cmd, size_t *len)
{
	char name[16];

	snprintf(name, sizeof(name), "%u.bin", cmd);
	return load_reply_file(name, len);
}

#define GENLSHIM_ID 0x7e

static void put_attr(unsigned char *buf, size_t *off, uint16_t type, const void *data, uint16_t len)
{
	struct nlattr *a = (struct nlattr *)(buf + *off);

	a->nla_len = NLA_HDRLEN + len;
	a->nla_type = type;
	memcpy(buf + *off + NLA_HDRLEN, data, len);
	*off += NLA_ALIGN(a->nla_len);
}

static void enqueue_done(const struct nlmsghdr *req, uint32_t portid)
{
	size_t len = NLMSG_HDRLEN + sizeof(int);

	enqueue(answer(len, NLMSG_DONE, NLM_F_MULTI, req, portid), len);
}

/* The family name asked for in a CTRL_CMD_GETFAMILY, or NULL. */
static const char *family_asked(const struct nlmsghdr *nlh)
{
	const struct genlmsghdr *g = NLMSG_DATA(nlh);
	const unsigned char *p = (const unsigned char *)g + GENL_HDRLEN;
	const unsigned char *end = (const unsigned char *)nlh + nlh->nlmsg_len;

	if (nlh->nlmsg_type != GENL_ID_CTRL || g->cmd != CTRL_CMD_GETFAMILY)
		return NULL;
	while (p + NLA_HDRLEN <= end) {
		const struct nlattr *a = (const struct nlattr *)p;

		if (a->nla_len < NLA_HDRLEN)
			break;
		if ((a->nla_type & NLA_TYPE_MASK) == CTRL_ATTR_FAMILY_NAME)
			return (const char *)a + NLA_HDRLEN;
		p += NLA_ALIGN(a->nla_len);
	}
	return NULL;
}

static void enqueue_family(const struct nlmsghdr *req, uint32_t portid, const char *name)
{
	unsigned char *buf = answer(256, GENL_ID_CTRL, 0, req, portid);
	struct nlmsghdr *nlh = (struct nlmsghdr *)buf;
	struct genlmsghdr *g = NLMSG_DATA(nlh);
	size_t off = NLMSG_HDRLEN + GENL_HDRLEN;
	uint16_t id = GENLSHIM_ID;
	uint32_t version = 1, hdrsize = 0, maxattr = 200;

	g->cmd = CTRL_CMD_NEWFAMILY;
	g->version = 2;
	put_attr(buf, &off, CTRL_ATTR_FAMILY_ID, &id, sizeof(id));
	put_attr(buf, &off, CTRL_ATTR_FAMILY_NAME, name, strlen(name) + 1);
	put_attr(buf, &off, CTRL_ATTR_VERSION, &version, sizeof(version));
	put_attr(buf, &off, CTRL_ATTR_HDRSIZE, &hdrsize, sizeof(hdrsize));
	put_attr(buf, &off, CTRL_ATTR_MAXATTR, &maxattr, sizeof(maxattr));
	nlh->nlmsg_len = off;
	enqueue(buf, off);
}

/* Returns 1 if the buffer held messages answered here, 0 if it is ordinary
 * traffic for the kernel. */
static int handle(int fd, const unsigned char *buf, size_t len)
{
	const struct nlmsghdr *nlh = (const struct nlmsghdr *)buf;
	const char *family = getenv("NT_GENLSHIM_FAMILY");
	int handled = 0;

	if (!family || !is_ours(fd))
		return 0;
	for (; NLMSG_OK(nlh, len); nlh = NLMSG_NEXT(nlh, len)) {
		uint32_t portid = portid_of(fd);
		const char *asked = family_asked(nlh);
		unsigned char *reply;
		size_t reply_len;
		uint8_t cmd;

		if (asked && !strcmp(asked, family)) {
			handled = 1;
			enqueue_family(nlh, portid, family);
			if (nlh->nlmsg_flags & NLM_F_ACK)
				enqueue_ack(nlh, portid, 0);
			continue;
		}
		if (nlh->nlmsg_type != GENLSHIM_ID)
			continue;
		handled = 1;
		log_request(nlh);
		cmd = ((const struct genlmsghdr *)NLMSG_DATA(nlh))->cmd;
		reply = load_reply(cmd, &reply_len);
		/* The file holds whole messages back to back (a dump: several);
		 * each becomes its own datagram. */
		for (size_t off = 0; reply && off + NLMSG_HDRLEN <= reply_len;) {
			struct nlmsghdr *r = (struct nlmsghdr *)(reply + off);
			size_t n = NLMSG_ALIGN(r->nlmsg_len);
			unsigned char *one;

			if (r->nlmsg_len < NLMSG_HDRLEN || off + r->nlmsg_len > reply_len) {
				fprintf(stderr, "genlshim: bad message in reply %u\n", cmd);
				abort();
			}
			r->nlmsg_type = GENLSHIM_ID;
			r->nlmsg_seq = nlh->nlmsg_seq;
			r->nlmsg_pid = portid;
			r->nlmsg_flags = (nlh->nlmsg_flags & NLM_F_DUMP) ? NLM_F_MULTI : 0;
			one = malloc(r->nlmsg_len);
			memcpy(one, r, r->nlmsg_len);
			enqueue(one, r->nlmsg_len);
			off += n;
		}
		free(reply);
		if (nlh->nlmsg_flags & NLM_F_DUMP)
			enqueue_done(nlh, portid);
		else if (nlh->nlmsg_flags & NLM_F_ACK)
			enqueue_ack(nlh, portid, 0);
	}
	return handled;
}
