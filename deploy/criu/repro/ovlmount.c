/*
 * ovlmount HOSTID OPTIONS TARGET
 *
 * Mounts an overlay on TARGET with OPTIONS (lowerdir=...,upperdir=...,
 * workdir=...) as a mounter whose fsuid and fsgid are HOSTID, capabilities
 * kept. overlayfs makes its upper-layer changes (work/work, copy-up) with
 * the mounter's credentials: through an idmapped upper layer (0 -> HOSTID)
 * the host root is unmapped (EOVERFLOW), HOSTID is the namespace's 0. With
 * idmapped lower and upper layers the container sees the rootfs owned by
 * its own root and writes land on disk with in-namespace ids.
 * Used by userns-runc.sh (case userns-overlay).
 */
#define _GNU_SOURCE
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct d[2];
	unsigned long id;

	if (argc != 4) {
		fprintf(stderr, "usage: %s HOSTID OPTIONS TARGET\n", argv[0]);
		return 2;
	}
	id = strtoul(argv[1], NULL, 10);
	setfsgid(id);
	setfsuid(id);
	/* A change of fsuid from 0 drops the file capabilities: take them back. */
	if (syscall(SYS_capget, &h, d)) {
		perror("capget");
		return 1;
	}
	d[0].effective = d[0].permitted;
	d[1].effective = d[1].permitted;
	if (syscall(SYS_capset, &h, d)) {
		perror("capset");
		return 1;
	}
	if (mount("overlay", argv[3], "overlay", 0, argv[2])) {
		perror("mount overlay");
		return 1;
	}
	return 0;
}
