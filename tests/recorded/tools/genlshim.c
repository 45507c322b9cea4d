/* genlshim: an LD_PRELOAD shim that stands in for a generic netlink family
 * the running kernel lacks (devlink here: the host kernel has none), so
 * that iproute2's `devlink` can be recorded.  A test tool, never shipped,
 * compiled at test time by tests/recorded/tools/devlink_record.py; derived
 * from nlshim.c (the dcbnl shim).
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
 * kernel untouched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <linux/netlink.h>
#include <linux/genetlink.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define QUEUE_MAX 32

struct datagram {
	unsigned char *data;
	size_t len;
};

static struct datagram queue[QUEUE_MAX];
static int queue_head, queue_len;

static ssize_t (*real_sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
static ssize_t (*real_sendmsg)(int, const struct msghdr *, int);
static ssize_t (*real_recvmsg)(int, struct msghdr *, int);
static ssize_t (*real_recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);

static void resolve(void)
{
	if (real_sendto)
		return;
	real_sendto = dlsym(RTLD_NEXT, "sendto");
	real_sendmsg = dlsym(RTLD_NEXT, "sendmsg");
	real_recvmsg = dlsym(RTLD_NEXT, "recvmsg");
	real_recvfrom = dlsym(RTLD_NEXT, "recvfrom");
}

static int is_generic(int fd)
{
	int domain = 0, proto = -1;
	socklen_t len = sizeof(domain);

	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) || domain != AF_NETLINK)
		return 0;
	len = sizeof(proto);
	if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len))
		return 0;
	return proto == NETLINK_GENERIC;
}

static uint32_t portid_of(int fd)
{
	struct sockaddr_nl addr;
	socklen_t len = sizeof(addr);

	memset(&addr, 0, sizeof(addr));
	if (getsockname(fd, (struct sockaddr *)&addr, &len))
		return 0;
	return addr.nl_pid;
}

static void enqueue(unsigned char *data, size_t len)
{
	if (queue_len == QUEUE_MAX) {
		fprintf(stderr, "genlshim: reply queue full\n");
		abort();
	}
	queue[(queue_head + queue_len) % QUEUE_MAX] = (struct datagram){ data, len };
	queue_len++;
}

static void log_request(const struct nlmsghdr *nlh)
{
	const char *path = getenv("NT_GENLSHIM_LOG");
	const unsigned char *p = (const unsigned char *)nlh;
	FILE *f;
	uint32_t i;

	if (!path)
		return;
	f = fopen(path, "a");
	if (!f) {
		perror("gegenlshim: NT_GENLSHIM_LOG");
		abort();
	}
	for (i = 0; i < nlh->nlmsg_len; i++)
		fprintf(f, "%02x", p[i]);
	fputc('\n', f);
	fclose(f);
}

static unsigned char *load_reply(uint8_t cmd, size_t *len)
{
	const char *dir = getenv("NT_GENLSHIM_REPLIES");
	char path[4096];
	unsigned char *buf;
	long size;
	FILE *f;

	if (!dir)
		return NULL;
	snprintf(path, sizeof(path), "%s/%u.bin", dir, cmd);
	f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	rewind(f);
	buf = malloc(size > 0 ? size : 1);
	if (!buf || fread(buf, 1, size, f) != (size_t)size) {
		fprintf(stderr, "genlshim: cannot read %s\n", path);
		abort();
	}
	fclose(f);
	*len = size;
	return buf;
}

/* netlink_ack(): an NLMSG_ERROR carrying the error and, with NETLINK_CAP_ACK
 * (which iproute2 sets), only the request's header. */
static void enqueue_ack(const struct nlmsghdr *req, uint32_t portid, int error)
{
	size_t len = NLMSG_HDRLEN + sizeof(int) + sizeof(*req);
	unsigned char *buf = calloc(1, len);
	struct nlmsghdr *nlh = (struct nlmsghdr *)buf;

	nlh->nlmsg_len = len;
	nlh->nlmsg_type = NLMSG_ERROR;
	nlh->nlmsg_flags = NLM_F_CAPPED;
	nlh->nlmsg_seq = req->nlmsg_seq;
	nlh->nlmsg_pid = portid;
	memcpy(buf + NLMSG_HDRLEN, &error, sizeof(error));
	memcpy(buf + NLMSG_HDRLEN + sizeof(int), req, sizeof(*req));
	enqueue(buf, len);
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
	unsigned char *buf = calloc(1, len);
	struct nlmsghdr *nlh = (struct nlmsghdr *)buf;

	nlh->nlmsg_len = len;
	nlh->nlmsg_type = NLMSG_DONE;
	nlh->nlmsg_flags = NLM_F_MULTI;
	nlh->nlmsg_seq = req->nlmsg_seq;
	nlh->nlmsg_pid = portid;
	enqueue(buf, len);
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
	unsigned char *buf = calloc(1, 256);
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
	nlh->nlmsg_type = GENL_ID_CTRL;
	nlh->nlmsg_seq = req->nlmsg_seq;
	nlh->nlmsg_pid = portid;
	enqueue(buf, off);
}

/* Returns 1 if the buffer held messages answered here, 0 if it is ordinary
 * traffic for the kernel. */
static int handle(int fd, const unsigned char *buf, size_t len)
{
	const struct nlmsghdr *nlh = (const struct nlmsghdr *)buf;
	const char *family = getenv("NT_GENLSHIM_FAMILY");
	int handled = 0;

	if (!family || !is_generic(fd))
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

static size_t dequeue(struct iovec *iov, size_t iovlen, int flags, int *truncated)
{
	struct datagram *d = &queue[queue_head];
	size_t off = 0, i;

	for (i = 0; i < iovlen && off < d->len; i++) {
		size_t n = d->len - off < iov[i].iov_len ? d->len - off : iov[i].iov_len;

		memcpy(iov[i].iov_base, d->data + off, n);
		off += n;
	}
	*truncated = off < d->len;
	off = (flags & MSG_TRUNC) ? d->len : off;
	if (!(flags & MSG_PEEK)) {
		free(d->data);
		queue_head = (queue_head + 1) % QUEUE_MAX;
		queue_len--;
	}
	return off;
}

ssize_t sendto(int fd, const void *buf, size_t len, int flags,
	       const struct sockaddr *addr, socklen_t alen)
{
	resolve();
	if (handle(fd, buf, len))
		return len;
	return real_sendto(fd, buf, len, flags, addr, alen);
}

ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	return sendto(fd, buf, len, flags, NULL, 0);
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	unsigned char *flat;
	size_t len = 0, off = 0, i;
	int handled;

	resolve();
	for (i = 0; i < msg->msg_iovlen; i++)
		len += msg->msg_iov[i].iov_len;
	flat = malloc(len ? len : 1);
	for (i = 0; i < msg->msg_iovlen; i++) {
		memcpy(flat + off, msg->msg_iov[i].iov_base, msg->msg_iov[i].iov_len);
		off += msg->msg_iov[i].iov_len;
	}
	handled = handle(fd, flat, len);
	free(flat);
	if (handled)
		return len;
	return real_sendmsg(fd, msg, flags);
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	int truncated;
	size_t n;

	resolve();
	if (!queue_len || !is_generic(fd))
		return real_recvmsg(fd, msg, flags);
	n = dequeue(msg->msg_iov, msg->msg_iovlen, flags, &truncated);
	if (msg->msg_name && msg->msg_namelen >= sizeof(struct sockaddr_nl)) {
		struct sockaddr_nl *sa = msg->msg_name;

		memset(sa, 0, sizeof(*sa));
		sa->nl_family = AF_NETLINK;  /* from the kernel: nl_pid 0 */
		msg->msg_namelen = sizeof(*sa);
	}
	msg->msg_controllen = 0;
	msg->msg_flags = truncated ? MSG_TRUNC : 0;
	return n;
}

ssize_t recvfrom(int fd, void *buf, size_t len, int flags,
		 struct sockaddr *addr, socklen_t *alen)
{
	struct iovec iov = { buf, len };
	int truncated;
	size_t n;

	resolve();
	if (!queue_len || !is_generic(fd))
		return real_recvfrom(fd, buf, len, flags, addr, alen);
	n = dequeue(&iov, 1, flags, &truncated);
	if (addr && alen && *alen >= sizeof(struct sockaddr_nl)) {
		memset(addr, 0, sizeof(struct sockaddr_nl));
		((struct sockaddr_nl *)addr)->nl_family = AF_NETLINK;
		*alen = sizeof(struct sockaddr_nl);
	}
	return n;
}

ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	return recvfrom(fd, buf, len, flags, NULL, NULL);
}
