/*
 * idmapmount SRC DST HOSTID COUNT
 *
 * Mounts an idmapped copy of the mount tree at SRC on DST (a directory):
 * the ids 0..COUNT-1 as stored on disk are seen as HOSTID..HOSTID+COUNT-1,
 * for uids and gids alike. A user namespace with that map is made for the
 * mount (a child process, gone when this exits). Kernel >= 5.12.
 * Used by userns-runc.sh; util-linux 2.38 has no X-mount.idmap.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int write_file(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = write(fd, s, strlen(s));
	close(fd);
	return n == (ssize_t)strlen(s) ? 0 : -1;
}

static int child_wait(void *arg)
{
	int *fds = arg;
	char c;

	/* Stays until the parent closes its end of the pipe. */
	close(fds[1]);
	while (read(fds[0], &c, 1) < 0 && errno == EINTR)
		;
	return 0;
}

int main(int argc, char **argv)
{
	static char stack[64 * 1024];
	struct mount_attr attr = { .attr_set = MOUNT_ATTR_IDMAP };
	char path[PATH_MAX], map[64];
	unsigned long hostid, count;
	int pipefd[2], usernsfd, treefd, status;
	pid_t pid;

	if (argc != 5) {
		fprintf(stderr, "usage: %s SRC DST HOSTID COUNT\n", argv[0]);
		return 2;
	}
	hostid = strtoul(argv[3], NULL, 10);
	count = strtoul(argv[4], NULL, 10);
	if (count == 0 || pipe2(pipefd, O_CLOEXEC))
		return 2;
	pid = clone(child_wait, stack + sizeof(stack), CLONE_NEWUSER | SIGCHLD, pipefd);
	if (pid < 0) {
		perror("clone");
		return 1;
	}
	snprintf(map, sizeof(map), "0 %lu %lu\n", hostid, count);
	snprintf(path, sizeof(path), "/proc/%d/uid_map", pid);
	if (write_file(path, map)) {
		perror("uid_map");
		goto fail;
	}
	snprintf(path, sizeof(path), "/proc/%d/gid_map", pid);
	if (write_file(path, map)) {
		perror("gid_map");
		goto fail;
	}
	snprintf(path, sizeof(path), "/proc/%d/ns/user", pid);
	usernsfd = open(path, O_RDONLY | O_CLOEXEC);
	if (usernsfd < 0) {
		perror("open userns");
		goto fail;
	}
	treefd = syscall(SYS_open_tree, AT_FDCWD, argv[1], OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
	if (treefd < 0) {
		perror("open_tree");
		goto fail;
	}
	attr.userns_fd = usernsfd;
	if (syscall(SYS_mount_setattr, treefd, "", AT_EMPTY_PATH, &attr, sizeof(attr))) {
		perror("mount_setattr");
		goto fail;
	}
	if (syscall(SYS_move_mount, treefd, "", AT_FDCWD, argv[2], MOVE_MOUNT_F_EMPTY_PATH)) {
		perror("move_mount");
		goto fail;
	}
	close(pipefd[1]);
	waitpid(pid, &status, 0);
	return 0;
fail:
	close(pipefd[1]);
	waitpid(pid, &status, 0);
	return 1;
}
