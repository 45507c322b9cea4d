/* shim_core.h: what nlshim.c (dcbnl over rtnetlink) and genlshim.c (a
 * generic netlink family) share -- an LD_PRELOAD stand-in for the kernel
 * end of one netlink protocol.  A test tool, never shipped.
 *
 * The including file defines, before #include "shim_core.h":
 *   SHIM_NAME          the prefix of its messages ("nlshim")
 *   SHIM_PROTOCOL      the netlink protocol it intercepts (NETLINK_ROUTE)
 *   SHIM_ENV_LOG       the variable naming the request log ("NT_NLSHIM_LOG")
 *   SHIM_ENV_REPLIES   the variable naming the reply directory
 * and, after it, handle(): 1 if the buffer held requests answered here (it
 * queues the answers with enqueue()), 0 if it is traffic for the kernel.
 *
 * Requests handle() takes never reach the kernel; the queued answers are
 * read back, one datagram each as the kernel sends them, by recvmsg/recvfrom
 * on the socket the request was sent on, and dropped when it is closed (as
 * the kernel drops a closed socket's unread ACKs: a daemon such as lldpad
 * opens a socket per request and reads only the reply, then reads events on
 * another).  All other traffic goes to the kernel.
 */
#ifndef SHIM_CORE_H
#define SHIM_CORE_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <linux/netlink.h>
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
	int fd;
};

static struct datagram queue[QUEUE_MAX];  /* in the order sent, any socket's */
static int queue_len;
static int sending_fd = -1;  /* the socket whose request handle() answers */
static int (*real_close)(int);

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
	real_close = dlsym(RTLD_NEXT, "close");
}

/* Is fd a netlink socket of the protocol this shim stands in for? */
static int is_ours(int fd)
{
	int domain = 0, proto = -1;
	socklen_t len = sizeof(domain);

	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) || domain != AF_NETLINK)
		return 0;
	len = sizeof(proto);
	if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len))
		return 0;
	return proto == SHIM_PROTOCOL;
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
		fprintf(stderr, SHIM_NAME ": reply queue full\n");
		abort();
	}
	queue[queue_len++] = (struct datagram){ data, len, sending_fd };
}

/* The index of fd's first queued datagram, or -1. */
static int queued_for(int fd)
{
	int i;

	for (i = 0; i < queue_len; i++)
		if (queue[i].fd == fd)
			return i;
	return -1;
}

static void drop(int i)
{
	free(queue[i].data);
	memmove(&queue[i], &queue[i + 1], (queue_len - i - 1) * sizeof(queue[0]));
	queue_len--;
}

static void log_request(const struct nlmsghdr *nlh)
{
	const char *path = getenv(SHIM_ENV_LOG);
	const unsigned char *p = (const unsigned char *)nlh;
	FILE *f;
	uint32_t i;

	if (!path)
		return;
	f = fopen(path, "a");
	if (!f) {
		perror(SHIM_NAME ": " SHIM_ENV_LOG);
		abort();
	}
	for (i = 0; i < nlh->nlmsg_len; i++)
		fprintf(f, "%02x", p[i]);
	fputc('\n', f);
	fclose(f);
}

/* The whole file SHIM_ENV_REPLIES/<name>, or NULL when there is none. */
static unsigned char *load_reply_file(const char *name, size_t *len)
{
	const char *dir = getenv(SHIM_ENV_REPLIES);
	char path[4096];
	unsigned char *buf;
	long size;
	FILE *f;

	if (!dir)
		return NULL;
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	rewind(f);
	buf = malloc(size > 0 ? size : 1);
	if (!buf || fread(buf, 1, size, f) != (size_t)size) {
		fprintf(stderr, SHIM_NAME ": cannot read %s\n", path);
		abort();
	}
	fclose(f);
	*len = size;
	return buf;
}

/* A zeroed buffer of len bytes whose netlink header answers req. */
static unsigned char *answer(size_t len, uint16_t type, uint16_t flags,
			     const struct nlmsghdr *req, uint32_t portid)
{
	unsigned char *buf = calloc(1, len);
	struct nlmsghdr *nlh = (struct nlmsghdr *)buf;

	nlh->nlmsg_len = len;
	nlh->nlmsg_type = type;
	nlh->nlmsg_flags = flags;
	nlh->nlmsg_seq = req->nlmsg_seq;
	nlh->nlmsg_pid = portid;
	return buf;
}

/* netlink_ack(): an NLMSG_ERROR carrying the error and, with NETLINK_CAP_ACK
 * (which iproute2 sets), only the request's header. */
static void enqueue_ack(const struct nlmsghdr *req, uint32_t portid, int error)
{
	size_t len = NLMSG_HDRLEN + sizeof(int) + sizeof(*req);
	unsigned char *buf = answer(len, NLMSG_ERROR, NLM_F_CAPPED, req, portid);

	memcpy(buf + NLMSG_HDRLEN, &error, sizeof(error));
	memcpy(buf + NLMSG_HDRLEN + sizeof(int), req, sizeof(*req));
	enqueue(buf, len);
}

static size_t dequeue(int at, struct iovec *iov, size_t iovlen, int flags, int *truncated)
{
	struct datagram *d = &queue[at];
	size_t off = 0, i;

	for (i = 0; i < iovlen && off < d->len; i++) {
		size_t n = d->len - off < iov[i].iov_len ? d->len - off : iov[i].iov_len;

		memcpy(iov[i].iov_base, d->data + off, n);
		off += n;
	}
	*truncated = off < d->len;
	off = (flags & MSG_TRUNC) ? d->len : off;
	if (!(flags & MSG_PEEK))
		drop(at);
	return off;
}

static int handle(int fd, const unsigned char *buf, size_t len);

ssize_t sendto(int fd, const void *buf, size_t len, int flags,
	       const struct sockaddr *addr, socklen_t alen)
{
	int handled;

	resolve();
	sending_fd = fd;
	handled = handle(fd, buf, len);
	sending_fd = -1;
	if (handled)
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
	sending_fd = fd;
	handled = handle(fd, flat, len);
	sending_fd = -1;
	free(flat);
	if (handled)
		return len;
	return real_sendmsg(fd, msg, flags);
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	int truncated, at;
	size_t n;

	resolve();
	at = queued_for(fd);
	if (at < 0)
		return real_recvmsg(fd, msg, flags);
	n = dequeue(at, msg->msg_iov, msg->msg_iovlen, flags, &truncated);
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
	int truncated, at;
	size_t n;

	resolve();
	at = queued_for(fd);
	if (at < 0)
		return real_recvfrom(fd, buf, len, flags, addr, alen);
	n = dequeue(at, &iov, 1, flags, &truncated);
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

int close(int fd)
{
	int at;

	resolve();
	while ((at = queued_for(fd)) >= 0)
		drop(at);
	return real_close(fd);
}

#endif /* SHIM_CORE_H */
