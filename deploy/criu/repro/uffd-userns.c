/*
 * uffd-userns: what a task in a user namespace (root in it, mapped to an
 * unprivileged host range) can get of userfaultfd on this host, with
 * vm.unprivileged_userfaultfd=0 (run as root; touches no sysctl):
 *
 *   1. userfaultfd(2) with flags 0 (kernel faults too);
 *   2. userfaultfd(2) with UFFD_USER_MODE_ONLY;
 *   3. USERFAULTFD_IOC_NEW on /dev/userfaultfd opened in the child;
 *   4. USERFAULTFD_IOC_NEW on /dev/userfaultfd opened by the parent
 *      (host root) before the child entered the namespace;
 *   5. UFFDIO_API asking for UFFD_FEATURE_EVENT_FORK (CRIU asks for it),
 *      made in the namespace on the uffd of 4;
 *   6. whether a fault taken by the kernel (read(2) from a pipe into a
 *      registered, missing page) is delivered to the handler, with the
 *      uffd of 4 and with one made with UFFD_USER_MODE_ONLY.
 *
 * Build: gcc -O2 -pthread -o uffd-userns uffd-userns.c
 * Usage: uffd-userns [HOSTID]   (default 100000; 65536 ids mapped)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

static int devfd = -1;
static int sync_pipe[2], ready_pipe[2];
static long page;
static unsigned long hostid;

static void say(const char *what, int ret)
{
	if (ret < 0)
		printf("  %-58s FAILS: %s\n", what, strerror(errno));
	else
		printf("  %-58s ok\n", what);
}

static int api(int uffd, unsigned long long features)
{
	struct uffdio_api a = { .api = UFFD_API, .features = features };

	return ioctl(uffd, UFFDIO_API, &a);
}

struct handler {
	int uffd;
	char *area;
	int served;
};

static void *serve(void *arg)
{
	struct handler *h = arg;
	struct pollfd p = { .fd = h->uffd, .events = POLLIN };
	struct uffd_msg msg;
	struct uffdio_copy c;
	static char src[1 << 16];

	/* One fault at most; 2 s without one means none was delivered. */
	if (poll(&p, 1, 2000) != 1 || !(p.revents & POLLIN) ||
	    read(h->uffd, &msg, sizeof(msg)) != sizeof(msg))
		return NULL;
	if (msg.event != UFFD_EVENT_PAGEFAULT)
		return NULL;
	memset(src, 'x', page);
	c.dst = msg.arg.pagefault.address & ~(page - 1);
	c.src = (unsigned long)src;
	c.len = page;
	c.mode = 0;
	if (ioctl(h->uffd, UFFDIO_COPY, &c) == 0)
		h->served = 1;
	return NULL;
}

/* A read(2) into a registered, missing page: the kernel takes the fault. */
static void kernel_fault(const char *what, int uffd)
{
	struct uffdio_register r;
	struct handler h = { .uffd = uffd };
	pthread_t t;
	int pfd[2];
	ssize_t n;
	char msg[160];

	h.area = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (h.area == MAP_FAILED || api(uffd, 0) || pipe(pfd)) {
		say(what, -1);
		return;
	}
	r.range.start = (unsigned long)h.area;
	r.range.len = page;
	r.mode = UFFDIO_REGISTER_MODE_MISSING;
	if (ioctl(uffd, UFFDIO_REGISTER, &r)) {
		say(what, -1);
		return;
	}
	pthread_create(&t, NULL, serve, &h);
	if (write(pfd[1], "hello", 5) != 5)
		return;
	n = read(pfd[0], h.area, 5);
	pthread_join(t, NULL);
	snprintf(msg, sizeof(msg), "%s: read() %s, fault %s", what,
		 n == 5 ? "ok" : strerror(errno), h.served ? "served" : "never delivered");
	printf("  %s\n", msg);
	munmap(h.area, page);
	close(pfd[0]);
	close(pfd[1]);
}

static int child(void)
{
	int fd, ret;
	char c;

	if (unshare(CLONE_NEWUSER)) {
		perror("unshare(CLONE_NEWUSER)");
		return 1;
	}
	/* Mapped by the parent once we are in the namespace. */
	if (write(ready_pipe[1], "r", 1) != 1 || read(sync_pipe[0], &c, 1) != 1)
		return 1;
	/* Become the namespace's root: host HOSTID, as a container's uid 0. */
	if (setresgid(0, 0, 0) || setresuid(0, 0, 0)) {
		perror("setresuid in the namespace");
		return 1;
	}
	printf("in the user namespace: uid %d (host uid %lu)\n", getuid(), hostid);

	fd = syscall(SYS_userfaultfd, O_CLOEXEC);
	say("1. userfaultfd(0)", fd);
	if (fd >= 0)
		close(fd);

	fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
	say("2. userfaultfd(UFFD_USER_MODE_ONLY)", fd);
	if (fd >= 0) {
		kernel_fault("6b. kernel fault, UFFD_USER_MODE_ONLY uffd", fd);
		close(fd);
	}

	fd = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	say("3. open(/dev/userfaultfd) in the namespace", fd);
	if (fd >= 0)
		close(fd);

	fd = ioctl(devfd, USERFAULTFD_IOC_NEW, O_CLOEXEC);
	say("4. USERFAULTFD_IOC_NEW on the parent's /dev/userfaultfd", fd);
	if (fd >= 0) {
		ret = api(fd, UFFD_FEATURE_EVENT_FORK);
		say("5. UFFDIO_API with UFFD_FEATURE_EVENT_FORK, in the namespace", ret);
		close(fd);
		fd = ioctl(devfd, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
		if (fd >= 0) {
			kernel_fault("6a. kernel fault, uffd from /dev/userfaultfd", fd);
			close(fd);
		}
	}
	fflush(stdout);
	return 0;
}

static int write_map(pid_t pid, const char *kind, unsigned long host)
{
	char path[64], map[64];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/%s", pid, kind);
	snprintf(map, sizeof(map), "0 %lu 65536\n", host);
	f = fopen(path, "w");
	if (!f)
		return -1;
	fputs(map, f);
	return fclose(f);
}

int main(int argc, char **argv)
{
	unsigned long host = argc > 1 ? strtoul(argv[1], NULL, 10) : 100000;
	int status;
	pid_t pid;
	FILE *f;
	char buf[16] = "?", c;

	page = sysconf(_SC_PAGESIZE);
	hostid = host;
	f = fopen("/proc/sys/vm/unprivileged_userfaultfd", "r");
	if (f) {
		if (!fgets(buf, sizeof(buf), f))
			strcpy(buf, "?");
		fclose(f);
	}
	printf("vm.unprivileged_userfaultfd = %s", buf);
	devfd = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (devfd < 0) {
		perror("open /dev/userfaultfd as the parent");
		return 1;
	}
	if (pipe(sync_pipe) || pipe(ready_pipe))
		return 1;
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0)
		exit(child());
	if (read(ready_pipe[0], &c, 1) != 1 || write_map(pid, "uid_map", host) ||
	    write_map(pid, "gid_map", host)) {
		perror("id map");
		kill(pid, SIGKILL);
	}
	if (write(sync_pipe[1], "g", 1) != 1)
		return 1;
	waitpid(pid, &status, 0);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
