/* child.h - a job's child process as the pool and the command it runs (`ddpmd train`, `ddpmd
 * sample`) both see it: the exit statuses that mean more than success or failure.
 */
#ifndef DDPMD_CHILD_H
#define DDPMD_CHILD_H

/* the command stopped on SIGINT/SIGTERM with its state saved (a training job: the checkpoint of
 * its last finished step); 128 + SIGINT, as a shell reports a Ctrl-C */
#define CHILD_EXIT_STOPPED 130
/* a sticky CUDA error poisoned the command's device: the pool fails the job and marks the device,
 * which admits no job again in the server's life */
#define CHILD_EXIT_POISONED 3

#endif
